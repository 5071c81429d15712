"""Apply mode's full-initialization terms from readings (numbers from an H200 start, rounded)."""

from __future__ import annotations

from memest_instrumentation.vllm import apply
from memest_instrumentation.vllm.state import GraphProfiling, state

from memest.estimate import full_init_kv_budget
from memest.schema import MemoryReading, StageGrowth

MiB = 1 << 20


def _r(used: int, reserved: int, pools: dict[str, int]) -> MemoryReading:
    return MemoryReading(
        time_ns=0,
        device_used_bytes=used,
        torch_reserved_bytes=reserved,
        torch_allocated_bytes=reserved,
        pool_reserved_bytes=pools,
    )


def _setup() -> MemoryReading:
    st = state()
    st.vllm.requested_memory_bytes = 100_000 * MiB
    st.vllm.weights_bytes = 15_000 * MiB
    st.figures.profile_headroom_bytes = 384 * MiB
    st.kv.profiling_kv_bytes = 256 * MiB
    # profiling capture: pool (0,2) grows 62 MiB, default pool +48 MiB, outside torch +178 MiB
    # of which 20 MiB is held by the graphs until teardown.
    st.graph_profile = GraphProfiling(
        start=_r(16_500 * MiB, 15_700 * MiB, {"0,0": 15_700 * MiB}),
        end_settled=_r(16_788 * MiB, 15_810 * MiB, {"0,0": 15_748 * MiB, "0,2": 62 * MiB}),
        pool="0,2",
        kv_init_added_bytes=260 * MiB,
    )
    st.stages.append(
        StageGrowth(stage="target.piecewise", phase="graph_profiling", pool_growth_bytes=60 * MiB)
    )
    st.stages.append(StageGrowth(stage="target.full", phase="graph_profiling", pool_growth_bytes=0))
    # after teardown: 958 MiB outside torch (the lazily loaded part of the growth stays)
    return _r(16_500 * MiB + 158 * MiB, 15_700 * MiB, {"0,0": 15_700 * MiB})


def test_terms_count_pool_by_reservation_and_what_teardown_released() -> None:
    now = _setup()
    terms = apply.measured_terms(object(), now)
    assert terms is not None
    assert terms.graph_pool_bytes == 62 * MiB
    assert terms.graph_pool_by_stage_bytes == {
        "target.piecewise": 60 * MiB,
        "target.full": 0,
        "between_stages": 2 * MiB,
    }
    assert terms.runner_buffer_bytes == (260 - 256) * MiB + 48 * MiB
    # outside torch now (958 MiB) + what the graphs held until teardown (978 - 958 = 20 MiB)
    assert terms.outside_torch_bytes == 958 * MiB + 20 * MiB
    assert terms.weights_bytes + terms.profiling_residue_bytes == 15_700 * MiB
    kv = full_init_kv_budget(terms)
    non_kv = 15_700 + 384 + 978 + 62 + 52
    assert kv == (100_000 - non_kv) * MiB


def test_no_profiling_keeps_vllm_budget() -> None:
    st = state()
    st.vllm.requested_memory_bytes = 1
    assert apply.measured_terms(object(), _r(1, 1, {})) is None

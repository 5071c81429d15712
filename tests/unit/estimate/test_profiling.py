"""Terms read around graph-memory profiling (apply mode), on readings whose every byte is known."""

from __future__ import annotations

from memest.estimate import full_init_kv_budget
from memest.estimate.profiling import ProfilingReadings, capture_details, profiling_terms
from memest.schema import MemoryReading

MiB = 1 << 20


def _at(used: int, reserved: int, allocated: int | None = None) -> MemoryReading:
    return MemoryReading(
        time_ns=0,
        device_used_bytes=used * MiB,
        torch_reserved_bytes=reserved * MiB,
        torch_allocated_bytes=(reserved if allocated is None else allocated) * MiB,
    )


def _readings(stages: dict[str, int]) -> ProfilingReadings:
    # The capture reserves 200 MiB: 150 in the throwaway pool, 50 in the default pool; the
    # graphs hold 100 MiB outside PyTorch until teardown (300 at the end, 200 once released).
    return ProfilingReadings(
        start=_at(1000, 800),
        end=_at(1300, 1000),
        now=_at(1100, 900, 880),  # 20 MiB of slack in partly used segments
        pool_growth_bytes=150 * MiB,
        kv_init_added_bytes=70 * MiB,
        profiling_kv_bytes=40 * MiB,
        weights_bytes=600 * MiB,
        activation_bytes=120 * MiB,
        requested_bytes=5000 * MiB,
        margin_bytes=10 * MiB,
        stage_pool_bytes=stages,
    )


def test_each_term_is_read_from_its_own_readings() -> None:
    terms = profiling_terms(_readings({"target.piecewise": 100 * MiB}), source="test")
    assert terms.graph_pool_bytes == 150 * MiB
    assert terms.graph_pool_by_stage_bytes == {
        "target.piecewise": 100 * MiB,
        "between_stages": 50 * MiB,
    }
    assert terms.outside_torch_bytes == (200 + 100) * MiB
    assert terms.runner_buffer_bytes == (30 + 50) * MiB
    # allocated beyond the weights: the slack is no term's (later allocations fill it)
    assert terms.profiling_residue_bytes == (880 - 600) * MiB
    # 5000 - (600 weights + 120 activation + 300 outside + 150 pool + 80 runner + 280 residue
    # + 10 margin)
    assert full_init_kv_budget(terms) == 3460 * MiB


def test_a_reading_before_the_weights_splits_the_baseline_from_the_residue() -> None:
    base = _readings({})
    split = ProfilingReadings(**{**base.__dict__, "before_weights": _at(40, 34, 33)})
    terms = profiling_terms(split, source="test")
    assert terms.baseline_torch_bytes == 34 * MiB
    assert terms.profiling_residue_bytes == (880 - 33 - 600) * MiB


def test_stage_windows_that_saw_more_than_the_pool_reading_win() -> None:
    terms = profiling_terms(_readings({"target.piecewise": 180 * MiB}), source="test")
    assert terms.graph_pool_bytes == 180 * MiB
    assert terms.graph_pool_by_stage_bytes == {"target.piecewise": 180 * MiB}


def test_details_name_the_capture_readings() -> None:
    details = capture_details(_readings({}))
    assert details == {
        "capture_default_pool_bytes": 50 * MiB,
        "capture_outside_torch_bytes": 100 * MiB,
        "capture_outside_torch_growth_bytes": 100 * MiB,
        "profiling_runner_buffer_bytes": 30 * MiB,
        "used_before_kv_bytes": 1100 * MiB,
        "serving_step_bytes": 0,  # the readings name no model shape
    }

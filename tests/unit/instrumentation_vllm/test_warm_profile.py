"""The activation term: a second, warm profile pass, and vLLM's own figure as the fallback."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import fake_start
import pytest
from memest_instrumentation.vllm import collect
from memest_instrumentation.vllm.state import reset_state, state

from memest.estimate.startup_plan import graph_profiling_kept
from memest.schema import MemoryReading, PhaseRecord, RetainedRow, RunReport, StageGrowth

MiB = 1 << 20


def _start(monkeypatch: pytest.MonkeyPatch, mode: str, compile_transient: int) -> Any:
    """A start whose first profile run also holds ``compile_transient`` bytes (torch.compile)."""
    dev, worker, _ = fake_start.sized_start(monkeypatch, mode, compile=compile_transient)
    return dev, worker


@pytest.mark.vllm
@pytest.mark.usefixtures("needs_vllm")
def test_apply_budgets_the_warm_pass_not_the_compiling_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dev, worker = _start(monkeypatch, "apply", compile_transient=900 * MiB)
    st = state()
    assert worker.calls.count("profile_run") == 2
    terms = st.apply_terms.terms
    assert terms is not None
    assert terms.profile_peak_activation_bytes == dev.sizes["activation"]
    # the first pass's transients come one after the other: its peak is the larger one
    assert any(f"peaked {900 * MiB} B above" in n for n in st.notes), st.notes
    usage = dev.used() + dev.sizes["activation"]
    assert -fake_start.PAGE_ALL < usage - worker.requested_memory <= 0
    assert any(p.name == "profile_run.warm" for p in st.phases)


def test_off_mode_runs_no_second_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    _, worker = _start(monkeypatch, "off", compile_transient=900 * MiB)
    assert worker.calls.count("profile_run") == 1


@pytest.mark.vllm
@pytest.mark.usefixtures("needs_vllm")
def test_plan_is_sized_with_the_warm_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, worker = _start(monkeypatch, "plan", compile_transient=900 * MiB)
    plan_kv = state().plan.kv_cache_memory_bytes
    kv_now = worker.cache_config.num_gpu_blocks * fake_start.PAGE_ALL
    usage = dev.used() + dev.sizes["activation"]
    # the next start keeps the same non-KV memory and plan_kv of KV: within one block of budget
    assert -fake_start.PAGE_ALL < usage - kv_now + plan_kv - worker.requested_memory <= 0


def test_vllm_headroom_stands_in_when_memests_hook_did_not_measure() -> None:
    reset_state()
    worker = SimpleNamespace(
        peak_activation_memory=700 * MiB,
        cudagraph_memory_estimate=300 * MiB,
        total_consumed=1,
        available_kv_cache_memory_bytes=1,
        model_runner=SimpleNamespace(model_memory_usage=1),
    )
    collect.vllm_budget(worker, 1)
    st = state()
    # vLLM 0.33.0 applies its graph estimate by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)
    assert st.figures.profile_headroom_bytes == 400 * MiB
    assert st.figures.profile_headroom_source == "vllm"


def _reading(allocated: int) -> MemoryReading:
    return MemoryReading(time_ns=0, torch_allocated_bytes=allocated, torch_reserved_bytes=allocated)


def _report(**breakdown: Any) -> RunReport:
    from memest.schema import Breakdown, RunConfig

    gp = PhaseRecord(
        name="graph_profiling.total", start=_reading(100 * MiB), end=_reading(212 * MiB)
    )
    return RunReport(
        run_id="r",
        model="m",
        config=RunConfig(model="m"),
        phases=[gp],
        breakdown=Breakdown(**breakdown) if breakdown else None,
    )


def test_graph_profiling_kept_reads_the_retained_view_when_history_was_recorded() -> None:
    report = _report(
        event_count=10,
        stages=[
            StageGrowth(stage="target.piecewise", phase="graph_profiling", pool_growth_bytes=0)
        ],
        retained=[
            RetainedRow(
                stage="target.piecewise",
                owner="compiled_piece",
                bytes=32 * MiB,
                phase="graph_profiling",
            ),
            RetainedRow(stage="target.piecewise", owner="compiled_piece", bytes=5 * MiB),
        ],
    )
    assert graph_profiling_kept(report) == 32 * MiB


def test_graph_profiling_kept_leaves_what_a_plan_start_allocates_on_a_surviving_stream() -> None:
    """A side stream's leftover (allocated again by a plan start) is not credited, and it takes
    one more workspace off the pass stream's (the plan start's dedicated main stream): 48 MiB
    on the pass stream, 16 MiB on the side stream -> 32 MiB; without stream roles (an older
    report) every graph-profiling row counts."""
    stages = [StageGrowth(stage="target.piecewise", phase="graph_profiling", pool_growth_bytes=0)]

    def row(nbytes: int, stream: str | None) -> RetainedRow:
        return RetainedRow.model_validate(
            {
                "stage": "target.piecewise",
                "owner": "cublas_workspace",
                "bytes": nbytes,
                "phase": "graph_profiling",
                "stream": stream,
            }
        )

    report = _report(
        event_count=10, stages=stages, retained=[row(48 * MiB, "pass"), row(16 * MiB, "side")]
    )
    assert graph_profiling_kept(report) == 32 * MiB
    only_side = _report(event_count=10, stages=stages, retained=[row(16 * MiB, "side")])
    assert graph_profiling_kept(only_side) == 0
    older = _report(event_count=10, stages=stages, retained=[row(48 * MiB, None)])
    assert graph_profiling_kept(older) == 48 * MiB


def test_graph_profiling_kept_falls_back_to_the_allocated_growth_of_the_pass() -> None:
    assert graph_profiling_kept(_report()) == 112 * MiB

"""Readings by stream in the estimates: the cache serving's first step reuses
(``compare.default_pool_cached``) and graph profiling's leftovers a plan start skips
(``startup_plan.graph_profiling_kept``) without an allocator history."""

from __future__ import annotations

from typing import Any, Literal

from memest.estimate.compare import default_pool_cached, usage_bytes
from memest.estimate.startup_plan import graph_profiling_kept
from memest.schema import (
    Breakdown,
    FullInitTerms,
    MemoryReading,
    PhaseRecord,
    RetainedRow,
    RunConfig,
    RunReport,
    StageGrowth,
)

MiB = 1 << 20
GiB = 1 << 30


def _report(phases: list[PhaseRecord] | None = None, **breakdown: Any) -> RunReport:
    return RunReport(
        run_id="r",
        model="m",
        config=RunConfig(model="m"),
        phases=phases or [],
        breakdown=Breakdown(**breakdown) if breakdown else None,
    )


def _end(serving_free: int | None) -> MemoryReading:
    # 4 GiB free in all, 3 GiB of it inside the graph pool '0,1'
    return MemoryReading(
        time_ns=0,
        device_used_bytes=20 * GiB,
        torch_reserved_bytes=10 * GiB,
        torch_allocated_bytes=6 * GiB,
        pool_reserved_bytes={"0,0": 7 * GiB, "0,1": 3 * GiB},
        serving_stream_free_bytes=serving_free,
    )


def _live_blocks(nbytes: int) -> dict[str, Any]:
    row = RetainedRow(stage="target.full", owner="graph_pool_live_blocks", bytes=nbytes)
    return {"retained": [row]}


def test_cached_is_the_serving_streams_free_bytes_when_read() -> None:
    assert default_pool_cached(_report(), _end(512 * MiB)) == 512 * MiB
    assert default_pool_cached(_report(**_live_blocks(GiB)), _end(512 * MiB)) == 512 * MiB


def test_cached_is_zero_when_the_serving_stream_holds_nothing_free() -> None:
    assert default_pool_cached(_report(), _end(0)) == 0


def test_cached_without_the_stream_reading_comes_from_the_totals() -> None:
    # free 10 - 6 = 4 GiB, less the graph pool's 3 GiB
    assert default_pool_cached(_report(), _end(None)) == 1 * GiB
    # the pool's 1 GiB of live blocks is not free: only 2 GiB of the pool is taken out
    assert default_pool_cached(_report(**_live_blocks(GiB)), _end(None)) == 2 * GiB


def test_usage_adds_the_headroom_beyond_the_serving_streams_cache() -> None:
    terms = FullInitTerms(
        requested_bytes=90 * GiB,
        weights_bytes=0,
        profile_peak_activation_bytes=2 * GiB,
        outside_torch_bytes=0,
        graph_pool_bytes=0,
        profiling_residue_bytes=0,
    )
    end = PhaseRecord(name="end", start=_end(None), end=_end(512 * MiB))
    assert usage_bytes(_report([end]), terms) == 20 * GiB + 2 * GiB - 512 * MiB
    old = PhaseRecord(name="end", start=_end(None), end=_end(None))
    assert usage_bytes(_report([old]), terms) == 20 * GiB + 1 * GiB


def _reading(allocated: int, aux: int | None) -> MemoryReading:
    return MemoryReading(
        time_ns=0,
        torch_allocated_bytes=allocated,
        torch_reserved_bytes=allocated,
        aux_stream_allocated_bytes=aux,
    )


def _pass(start: tuple[int, int | None], end: tuple[int, int | None]) -> PhaseRecord:
    return PhaseRecord(name="graph_profiling.total", start=_reading(*start), end=_reading(*end))


BASE = 10 * GiB


def test_credit_takes_the_aux_streams_workspace_twice_off_the_growth() -> None:
    # DeepSeek-V3 shape on an H200: two 32 MiB cuBLAS workspaces kept, one on the aux stream
    gp = _pass((BASE, 0), (BASE + 67_259_904, 33_554_432))
    assert graph_profiling_kept(_report([gp])) == 151_040


def test_credit_without_aux_readings_is_the_whole_growth() -> None:
    assert graph_profiling_kept(_report([_pass((BASE, None), (BASE + 96 * MiB, None))])) == 96 * MiB
    assert graph_profiling_kept(_report([_pass((BASE, 0), (BASE + 96 * MiB, None))])) == 96 * MiB
    assert graph_profiling_kept(_report([_pass((BASE, None), (BASE + 96 * MiB, 0))])) == 96 * MiB


def test_credit_with_no_aux_growth_is_the_whole_growth() -> None:
    assert graph_profiling_kept(_report([_pass((BASE, 0), (BASE + 40 * MiB, 0))])) == 40 * MiB
    # the aux stream freed some: no side growth
    gp = _pass((BASE, 8 * MiB), (BASE + 40 * MiB, 2 * MiB))
    assert graph_profiling_kept(_report([gp])) == 40 * MiB


def test_credit_is_zero_when_the_aux_growth_is_over_half_the_growth() -> None:
    assert graph_profiling_kept(_report([_pass((BASE, 0), (BASE + 40 * MiB, 24 * MiB))])) == 0
    assert graph_profiling_kept(_report([_pass((BASE, 0), (BASE + 40 * MiB, 20 * MiB))])) == 0
    assert graph_profiling_kept(_report([_pass((BASE, 0), (BASE + 40 * MiB, 64 * MiB))])) == 0


def test_credit_without_growth_is_zero() -> None:
    assert graph_profiling_kept(_report([_pass((BASE, 0), (BASE - 8 * MiB, 0))])) == 0
    assert graph_profiling_kept(_report([_pass((BASE, 0), (BASE - 8 * MiB, 16 * MiB))])) == 0


def test_credit_reads_the_last_graph_profiling_pass() -> None:
    first = _pass((BASE, 0), (BASE + 96 * MiB, 0))
    last = _pass((BASE, 0), (BASE + 48 * MiB, 16 * MiB))
    assert graph_profiling_kept(_report([first, last])) == 16 * MiB


def test_credit_without_a_graph_profiling_pass_is_zero() -> None:
    other = PhaseRecord(name="capture", start=_reading(BASE, 0), end=_reading(2 * BASE, 0))
    assert graph_profiling_kept(_report([other])) == 0


def test_credit_reads_the_readings_when_the_breakdown_has_no_history() -> None:
    gp = _pass((BASE, 0), (BASE + 67_259_904, 33_554_432))
    stages = [StageGrowth(stage="target.piecewise", phase="graph_profiling", pool_growth_bytes=0)]
    row = RetainedRow(
        stage="target.piecewise", owner="cublas_workspace", bytes=5 * MiB, phase="graph_profiling"
    )
    assert graph_profiling_kept(_report([gp], event_count=0, stages=stages, retained=[row])) == (
        151_040
    )
    # a history without a graph_profiling stage: the readings too
    assert graph_profiling_kept(_report([gp], event_count=10, retained=[row])) == 151_040


def test_credit_with_a_history_reads_the_retained_rows_not_the_readings() -> None:
    gp = _pass((BASE, 0), (BASE + 67_259_904, 33_554_432))
    stages = [StageGrowth(stage="target.piecewise", phase="graph_profiling", pool_growth_bytes=0)]

    def row(nbytes: int, stream: Literal["pass", "side"]) -> RetainedRow:
        return RetainedRow(
            stage="target.piecewise",
            owner="cublas_workspace",
            bytes=nbytes,
            phase="graph_profiling",
            stream=stream,
        )

    rows = [row(48 * MiB, "pass"), row(16 * MiB, "side")]
    report = _report([gp], event_count=10, stages=stages, retained=rows)
    assert graph_profiling_kept(report) == 32 * MiB  # 48 own less 16 side

"""Aggregate the per-rank reports of one run and flag ranks that disagree.

Tensor-parallel ranks of one start should spend nearly the same memory; a rank whose figure
(weights, graph pool, each capture stage's pool growth, ...) differs from the median by more than
a threshold (default 5 % and at least 64 MiB) is flagged, naming the figure. This is the one rule
for "ranks agree": ``memest analyze --run DIR``, the service's run JSON and the dashboard use it.
What TP adds outside PyTorch on every rank (memest.estimate.parallel.run_parallel_bytes) is the
same on each rank of a group, so it moves no rank against the median; ``memest analyze --run``
prints it beside this table.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from memest.errors import ReportFormatError
from memest.schema import RunReport, StageGrowth
from memest.units import MiB, fmt_bytes

DEFAULT_REL_THRESHOLD = 0.05
DEFAULT_ABS_THRESHOLD_BYTES = 64 * MiB


def _phase_added(report: RunReport, name: str) -> int | None:
    for p in report.phases:
        if p.name == name and p.end.device_used_bytes is not None:
            return p.end.device_used_bytes - (p.start.device_used_bytes or 0)
    return None


def _final_used(report: RunReport) -> int | None:
    for p in reversed(report.phases):
        if p.end.device_used_bytes is not None:
            return p.end.device_used_bytes
    return None


FIGURES: dict[str, Callable[[RunReport], int | None]] = {
    "weights_bytes": lambda r: r.vllm.weights_bytes if r.vllm else None,
    "graph_pool_growth_bytes": lambda r: (
        r.breakdown.graph_pool_growth_bytes if r.breakdown else None
    ),
    "capture_added_bytes": lambda r: _phase_added(r, "capture"),
    "kv_blocks": lambda r: r.kv_cache.num_blocks if r.kv_cache else None,
    "available_kv_bytes": lambda r: r.vllm.available_kv_cache_bytes if r.vllm else None,
    "used_end_bytes": _final_used,
    "vllm_cudagraph_logged_bytes": lambda r: r.vllm.cudagraph_estimate_bytes if r.vllm else None,
}
"""The per-rank figures compared across ranks (name -> reader; None when the report lacks it)."""


#: Prefix of the per-stage figures: "stage:<stage name>" (pool growth in bytes).
STAGE_FIGURE = "stage:"


def capture_stages(report: RunReport) -> list[StageGrowth]:
    """The stages of the real capture (phase "capture"); all stages when no row names that phase.

    A start also records the graph-memory profiling pass (phase "graph_profiling"), whose pool
    is thrown away: counting both would double the graphs and the pool.
    """
    if report.breakdown is None:
        return []
    stages = report.breakdown.stages
    real = [s for s in stages if s.phase == "capture"]
    return real or list(stages)


def _stage_figures(report: RunReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for st in capture_stages(report):
        key = STAGE_FIGURE + st.stage
        out[key] = out.get(key, 0) + st.pool_growth_bytes
    return out


def _in_bytes(figure: str) -> bool:
    return figure.endswith("_bytes") or figure.startswith(STAGE_FIGURE)


@dataclass(frozen=True)
class RankOutlier:
    """One rank whose figure differs from the median of all ranks by more than the threshold."""

    figure: str
    rank: int
    value: int
    median: float
    difference: float

    def describe(self) -> str:
        unit = _in_bytes(self.figure)
        fmt = fmt_bytes if unit else (lambda v: f"{v:.0f}")
        return (
            f"rank {self.rank}: {self.figure} {fmt(self.value)} vs median {fmt(self.median)} "
            f"({self.difference:+.1%})"
        )


@dataclass
class RankAggregate:
    """The ranks of one run side by side."""

    run_id: str
    world_size: int
    ranks: list[int]
    missing_ranks: list[int]
    figures: dict[str, dict[int, int]] = field(default_factory=dict)
    outliers: list[RankOutlier] = field(default_factory=list)
    hook_errors: dict[int, list[str]] = field(default_factory=dict)

    @property
    def consistent(self) -> bool:
        return not self.outliers and not self.missing_ranks

    @property
    def binding_rank(self) -> int | None:
        """The rank that bound the KV cache: vLLM gives every rank the blocks of the one that
        returned the least KV memory (in apply mode, memest's budget), lowest rank on a tie."""
        available = self.figures.get("available_kv_bytes") or {}
        if not available:
            return None
        return min(available, key=lambda rank: (available[rank], rank))


def aggregate_ranks(
    reports: Sequence[RunReport],
    *,
    rel_threshold: float = DEFAULT_REL_THRESHOLD,
    abs_threshold_bytes: int = DEFAULT_ABS_THRESHOLD_BYTES,
) -> RankAggregate:
    """Aggregate one run's per-rank reports and flag ranks that disagree.

    A rank is flagged for a figure when it differs from the median of all ranks by more than
    ``rel_threshold`` of the median and (for byte figures) by more than ``abs_threshold_bytes``.

    Raises:
        ReportFormatError: no reports, reports of different runs, or one rank reported twice.
    """
    if not reports:
        raise ReportFormatError("no reports to aggregate")
    if rel_threshold < 0 or abs_threshold_bytes < 0:
        raise ReportFormatError(
            f"thresholds must not be negative (rel={rel_threshold}, abs={abs_threshold_bytes})"
        )
    run_ids = sorted({r.run_id for r in reports})
    if len(run_ids) > 1:
        raise ReportFormatError(f"reports of several runs given: {', '.join(run_ids)}")
    by_rank: dict[int, RunReport] = {}
    for r in reports:
        if r.rank in by_rank:
            raise ReportFormatError(f"run {r.run_id}: rank {r.rank} reported twice")
        by_rank[r.rank] = r
    world = max(max(r.world_size for r in reports), max(by_rank) + 1)
    agg = RankAggregate(
        run_id=run_ids[0],
        world_size=world,
        ranks=sorted(by_rank),
        missing_ranks=[k for k in range(world) if k not in by_rank],
        hook_errors={k: list(r.hook_errors) for k, r in by_rank.items() if r.hook_errors},
    )
    stages = {rank: _stage_figures(r) for rank, r in by_rank.items()}
    table: dict[str, dict[int, int]] = {}
    for name, read in FIGURES.items():
        table[name] = {k: v for k, r in sorted(by_rank.items()) if (v := read(r)) is not None}
    for rank, figures in sorted(stages.items()):
        for name, value in figures.items():
            table.setdefault(name, {})[rank] = value
    for name, values in table.items():
        if not values:
            continue
        agg.figures[name] = values
        _flag_outliers(agg, name, values, rel_threshold, abs_threshold_bytes)
    return agg


def _flag_outliers(
    agg: RankAggregate,
    name: str,
    values: dict[int, int],
    rel_threshold: float,
    abs_threshold_bytes: int,
) -> None:
    """Flag each rank whose value is off the median by both thresholds."""
    if len(values) < 2:
        return
    median = statistics.median(values.values())
    for rank, value in values.items():
        diff = value - median
        rel = diff / median if median else (0.0 if diff == 0 else float("inf"))
        over_abs = abs(diff) > abs_threshold_bytes if _in_bytes(name) else True
        if abs(rel) > rel_threshold and over_abs:
            agg.outliers.append(RankOutlier(name, rank, value, median, rel))


class RankCheck(BaseModel):
    """Do the ranks of one run agree (the rule of ``aggregate_ranks``)?"""

    world_size: int
    ranks_present: list[int]
    ranks_missing: list[int]
    agree: bool | None = Field(
        description="None when fewer than two ranks reported; else no rank off the median"
    )
    tolerance_fraction: float = DEFAULT_REL_THRESHOLD
    tolerance_bytes: int = DEFAULT_ABS_THRESHOLD_BYTES
    max_spread_bytes: int = 0
    disagreeing_stages: list[str] = Field(default_factory=list)
    disagreeing_figures: list[str] = Field(default_factory=list)
    binding_rank: int | None = Field(
        default=None,
        description="The rank whose KV memory bound every rank's KV cache (the least available)",
    )


def rank_check(reports: Sequence[RunReport]) -> RankCheck:
    """The ranks of one run side by side: missing ranks, figures a rank disagrees on."""
    agg = aggregate_ranks(reports)
    check = RankCheck(
        world_size=agg.world_size,
        ranks_present=agg.ranks,
        ranks_missing=agg.missing_ranks,
        agree=None,
        binding_rank=agg.binding_rank,
    )
    if len(agg.ranks) < 2:
        return check
    figures = list(dict.fromkeys(o.figure for o in agg.outliers))
    stage_sets = {frozenset(_stage_figures(r)) for r in reports}
    spreads = [max(v.values()) - min(v.values()) for k, v in agg.figures.items() if _in_bytes(k)]
    check.agree = not figures and len(stage_sets) == 1
    check.max_spread_bytes = max(spreads, default=0)
    check.disagreeing_figures = figures
    check.disagreeing_stages = [
        f.removeprefix(STAGE_FIGURE) for f in figures if f.startswith(STAGE_FIGURE)
    ]
    return check

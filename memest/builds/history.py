"""A model's builds over time and the regressions each introduced: the regression policy
(thresholds, and which earlier run is each run's baseline). The reporters and the service format
a :class:`History`. No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from memest.builds.runs import (
    Change,
    build_label,
    config_changes,
    config_summary,
    fingerprint,
    run_facts,
)
from memest.schema import RunReport
from memest.units import GiB

#: A later build regresses when its KV tokens drop by more than this fraction ...
KV_DROP_FRACTION = 0.01
#: ... or its graph pool grows by more than this fraction ...
POOL_GROWTH_FRACTION = 0.05
#: ... or the magnitude of its estimator error grows by more than this many bytes.
ESTIMATE_ERROR_GROWTH_BYTES = GiB // 4


class HistoryPoint(BaseModel):
    """One build of a model, in time order, with the regressions it introduced."""

    run_id: str
    build: str
    commit: str | None = None
    created_at: datetime
    source: str
    config_fingerprint: str = ""
    config_summary: str = ""
    series: int = Field(
        default=0, description="Index of the point's configuration in History.configs"
    )
    kv_tokens: int | None = None
    graph_pool_bytes: int | None = None
    estimator_error_bytes: int | None = None
    kv_sized_by: str | None = Field(
        default=None,
        description="Who sized the start's KV cache: 'vllm', 'memest' (apply mode, "
        "MEMEST_ESTIMATE) or 'memest-plan'; None when the report does not say",
    )
    compared_with: str | None = Field(
        default=None,
        description="The previous run of the same configuration fingerprint whose KV cache the "
        "same estimator sized: the baseline of the regression checks (None: the first such run)",
    )
    config_changes: list[Change] = Field(
        default_factory=list,
        description="For the first run of a configuration: how it differs from the run before "
        "it (empty for a run with a baseline: that one has the same configuration)",
    )
    regressions: list[str] = Field(
        default_factory=list,
        description="kv_tokens, graph_pool_bytes or estimator_error_bytes when worse than the "
        "baseline (compared_with) by more than the thresholds",
    )


class HistoryConfig(BaseModel):
    """One configuration (fingerprint) among a model's runs: one series of the history."""

    fingerprint: str
    summary: str
    runs: int


#: How each regression key reads on a page.
REGRESSION_LABELS = {
    "kv_tokens": "KV tokens dropped",
    "graph_pool_bytes": "graph pool grew",
    "estimator_error_bytes": "vLLM's usage − budget grew",
}


class History(BaseModel):
    model: str
    points: list[HistoryPoint]
    configs: list[HistoryConfig] = Field(default_factory=list)
    regression_labels: dict[str, str] = Field(
        default_factory=lambda: dict(REGRESSION_LABELS),
        description="How each regression key reads",
    )
    kv_drop_fraction: float = KV_DROP_FRACTION
    pool_growth_fraction: float = POOL_GROWTH_FRACTION
    estimate_error_growth_bytes: int = ESTIMATE_ERROR_GROWTH_BYTES


def _regressions(p: HistoryPoint, prev: HistoryPoint) -> list[str]:
    """What got worse from ``prev`` (same configuration) to ``p`` beyond the thresholds."""
    out = []
    if p.kv_tokens is not None and prev.kv_tokens:
        if p.kv_tokens < prev.kv_tokens * (1 - KV_DROP_FRACTION):
            out.append("kv_tokens")
    if p.graph_pool_bytes is not None and prev.graph_pool_bytes:
        if p.graph_pool_bytes > prev.graph_pool_bytes * (1 + POOL_GROWTH_FRACTION):
            out.append("graph_pool_bytes")
    if p.estimator_error_bytes is not None and prev.estimator_error_bytes is not None:
        grow = abs(p.estimator_error_bytes) - abs(prev.estimator_error_bytes)
        if grow > ESTIMATE_ERROR_GROWTH_BYTES:
            out.append("estimator_error_bytes")
    return out


def history(model: str, reports: Sequence[RunReport]) -> History:
    """Per-build history of a model (one rank-0 report per run, oldest first).

    Regressions are checked against the previous run of the same configuration fingerprint
    whose KV cache the same estimator sized (an apply start's vLLM figure is a recomputation,
    not what vLLM gave); the first run of a configuration says how it differs from the run
    before it.
    """
    points: list[HistoryPoint] = []
    configs: dict[str, HistoryConfig] = {}
    last: dict[tuple[str, str | None], HistoryPoint] = {}
    prev_report: RunReport | None = None
    for rep in sorted(reports, key=lambda r: (r.created_at, r.run_id)):
        f = run_facts(rep)
        fp = fingerprint(rep)
        cfg = configs.setdefault(
            fp, HistoryConfig(fingerprint=fp, summary=config_summary(rep.config), runs=0)
        )
        cfg.runs += 1
        before = last.get((fp, f.kv_sized_by))
        p = HistoryPoint(
            run_id=rep.run_id,
            build=build_label(rep),
            commit=rep.build.vllm_commit,
            created_at=rep.created_at,
            source=rep.source,
            config_fingerprint=fp,
            config_summary=cfg.summary,
            series=list(configs).index(fp),
            kv_tokens=f.kv_tokens,
            graph_pool_bytes=f.graph_pool_bytes,
            estimator_error_bytes=f.estimator_error_bytes,
            kv_sized_by=f.kv_sized_by,
            compared_with=before.run_id if before else None,
        )
        if before is not None:
            p.regressions = _regressions(p, before)
        elif prev_report is not None and fingerprint(prev_report) != fp:
            p.config_changes = config_changes(prev_report.config, rep.config)
        points.append(p)
        last[(fp, f.kv_sized_by)] = p
        prev_report = rep
    return History(model=model, points=points, configs=list(configs.values()))

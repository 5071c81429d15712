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
    config_values,
    fingerprint,
    run_facts,
)
from memest.schema import RunConfig, RunReport
from memest.units import GiB

#: A later build regresses when its KV tokens drop by more than this fraction ...
KV_DROP_FRACTION = 0.01
#: ... or its graph pool grows by more than this fraction ...
POOL_GROWTH_FRACTION = 0.05
#: ... or its usage minus budget moves away from 0 by more than this many bytes.
USAGE_MINUS_BUDGET_GROWTH_BYTES = GiB // 4


class HistoryPoint(BaseModel):
    """One build of a model, in time order, with the regressions it introduced."""

    run_id: str
    build: str
    commit: str | None = None
    created_at: datetime
    source: str
    config_fingerprint: str = ""
    config_summary: str = ""
    kv_cache_dtype: str | None = Field(
        default=None,
        description="The KV cache's element type as the start allocated it (its KV-cache spec): "
        "runs whose configuration does not record --kv-cache-dtype are told apart by it",
    )
    series: int = Field(
        default=0, description="Index of the point's configuration in History.configs"
    )
    kv_tokens: int | None = None
    graph_pool_bytes: int | None = None
    usage_minus_budget_bytes: int | None = Field(
        default=None,
        description="This start's usage minus budget (its accounting, whoever sized the KV "
        "cache; positive = over budget), as the run page's card shows it",
    )
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
        description="kv_tokens, graph_pool_bytes or usage_minus_budget_bytes when worse than the "
        "baseline (compared_with) by more than the thresholds",
    )


class HistoryConfig(BaseModel):
    """One configuration (fingerprint) among a model's runs: one series of the history."""

    fingerprint: str
    summary: str
    runs: int
    kv_cache_dtype: str | None = None
    fields: dict[str, str] = Field(
        default_factory=dict,
        exclude=True,  # for legends that tell look-alike configurations apart; not in the API
        description="Every configuration field (memest.builds.runs.config_values)",
    )


#: How each regression key reads on a page.
REGRESSION_LABELS = {
    "kv_tokens": "KV tokens dropped",
    "graph_pool_bytes": "graph pool grew",
    "usage_minus_budget_bytes": "usage − budget moved away from 0",
}


class History(BaseModel):
    model: str
    config_model: str = Field(
        default="", exclude=True, description="The newest run's model as its configuration names it"
    )
    points: list[HistoryPoint]
    configs: list[HistoryConfig] = Field(default_factory=list)
    regression_labels: dict[str, str] = Field(
        default_factory=lambda: dict(REGRESSION_LABELS),
        description="How each regression key reads",
    )
    kv_drop_fraction: float = KV_DROP_FRACTION
    pool_growth_fraction: float = POOL_GROWTH_FRACTION
    usage_growth_bytes: int = USAGE_MINUS_BUDGET_GROWTH_BYTES


def _regressions(p: HistoryPoint, prev: HistoryPoint) -> list[str]:
    """What got worse from ``prev`` (same configuration) to ``p`` beyond the thresholds."""
    out = []
    if p.kv_tokens is not None and prev.kv_tokens:
        if p.kv_tokens < prev.kv_tokens * (1 - KV_DROP_FRACTION):
            out.append("kv_tokens")
    if p.graph_pool_bytes is not None and prev.graph_pool_bytes:
        if p.graph_pool_bytes > prev.graph_pool_bytes * (1 + POOL_GROWTH_FRACTION):
            out.append("graph_pool_bytes")
    if p.usage_minus_budget_bytes is not None and prev.usage_minus_budget_bytes is not None:
        grow = abs(p.usage_minus_budget_bytes) - abs(prev.usage_minus_budget_bytes)
        if grow > USAGE_MINUS_BUDGET_GROWTH_BYTES:
            out.append("usage_minus_budget_bytes")
    return out


class HistoryEntry(BaseModel):
    """What the history takes from one run's lead report (small: kept per report by a page
    cache, so a history of thousands of runs never parses them all again)."""

    point: HistoryPoint
    config: RunConfig
    fields: dict[str, str]


def history_entry(report: RunReport) -> HistoryEntry:
    """One run's point (before it is compared with the others) and its configuration."""
    f = run_facts(report)
    point = HistoryPoint(
        run_id=report.run_id,
        build=build_label(report),
        commit=report.build.vllm_commit,
        created_at=report.created_at,
        source=report.source,
        config_fingerprint=fingerprint(report),
        config_summary=config_summary(report.config),
        kv_tokens=f.kv_tokens,
        graph_pool_bytes=f.graph_pool_bytes,
        usage_minus_budget_bytes=f.usage_minus_budget_bytes,
        kv_sized_by=f.kv_sized_by,
        kv_cache_dtype=report.kv_cache.dtype if report.kv_cache is not None else None,
    )
    fields = config_values(report.config)
    if point.kv_cache_dtype is not None:
        fields["KV cache element"] = KV_ELEMENT_WORDS.get(
            point.kv_cache_dtype, point.kv_cache_dtype
        )
    return HistoryEntry(point=point, config=report.config, fields=fields)


#: The KV cache's element type as the legend words it (vLLM stores an FP8 KV cache as uint8).
KV_ELEMENT_WORDS = {"uint8": "1 byte (FP8)"}


def series_key(point: HistoryPoint) -> tuple[str, str | None]:
    """What one series of the history is: a configuration fingerprint and the KV cache's element
    type (an FP8 KV cache holds twice the tokens of a BF16 one under the same flags, and older
    reports record no --kv-cache-dtype in their configuration)."""
    return point.config_fingerprint, point.kv_cache_dtype


def history(model: str, reports: Sequence[RunReport]) -> History:
    """Per-build history of a model (one rank-0 report per run, oldest first): history_of
    the reports' entries."""
    return history_of(model, [history_entry(r) for r in reports])


def history_of(model: str, entries: Sequence[HistoryEntry]) -> History:
    """Per-build history of a model from its runs' entries (any order; sorted oldest first).

    Regressions are checked against the previous run of the same configuration fingerprint
    whose KV cache the same estimator sized (an apply start's vLLM figure is a recomputation,
    not what vLLM gave); the first run of a configuration says how it differs from the run
    before it.
    """
    points: list[HistoryPoint] = []
    configs: dict[tuple[str, str | None], HistoryConfig] = {}
    series: dict[tuple[str, str | None], int] = {}
    last: dict[tuple[tuple[str, str | None], str | None], HistoryPoint] = {}
    prev: HistoryEntry | None = None
    for entry in sorted(entries, key=lambda e: (e.point.created_at, e.point.run_id)):
        fp = series_key(entry.point)
        cfg = configs.setdefault(
            fp,
            HistoryConfig(
                fingerprint=fp[0],
                summary=entry.point.config_summary,
                runs=0,
                kv_cache_dtype=fp[1],
                fields=entry.fields,
            ),
        )
        cfg.runs += 1
        series.setdefault(fp, len(series))
        before = last.get((fp, entry.point.kv_sized_by))
        p = entry.point.model_copy(
            update={"series": series[fp], "compared_with": before.run_id if before else None}
        )
        if before is not None:
            p.regressions = _regressions(p, before)
        elif prev is not None and series_key(prev.point) != fp:
            p.config_changes = config_changes(prev.config, entry.config)
            if prev.point.kv_cache_dtype != p.kv_cache_dtype:
                p.config_changes.append(
                    Change(
                        field="KV cache element",
                        a=str(prev.point.kv_cache_dtype),
                        b=str(p.kv_cache_dtype),
                    )
                )
        points.append(p)
        last[(fp, p.kv_sized_by)] = p
        prev = entry
    return History(
        model=model,
        points=points,
        configs=list(configs.values()),
        config_model=prev.config.model if prev is not None else "",
    )


#: Runs per history page (the newest page first; ?page= goes back in time).
HISTORY_PAGE_RUNS = 100


def history_window(hist: History, page: int, size: int = HISTORY_PAGE_RUNS) -> History:
    """Page ``page`` of a history (1 = the newest ``size`` runs, 2 = the ones before, ...):
    its points and configurations, the series numbered again in their order on the page so
    each configuration of the page has its own colour and marker; regressions and baselines
    stay those of the whole history."""
    end = max(len(hist.points) - (page - 1) * size, 0)
    points = hist.points[max(end - size, 0) : end]
    configs = {(c.fingerprint, c.kv_cache_dtype): c for c in hist.configs}
    order = list(dict.fromkeys(series_key(p) for p in points))
    renumbered = [p.model_copy(update={"series": order.index(series_key(p))}) for p in points]
    return hist.model_copy(update={"points": renumbered, "configs": [configs[fp] for fp in order]})


def history_pages(hist: History, size: int = HISTORY_PAGE_RUNS) -> int:
    """How many pages of ``size`` runs the history has (at least 1)."""
    return max(1, -(-len(hist.points) // size))

"""One accounting of a start, computed once: the figures every surface shows.

``account(report)`` recomputes a report's figures with this version's definitions (the
full-initialization terms, usage at serving's first full-size step, each estimator's budget).
A report without the phase readings that needs (the seed's published figures, for instance) keeps
its stored figures, flagged as measured by an older definition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast, get_args

from memest.errors import MemestError
from memest.estimate.compare import compare
from memest.estimate.growable import report_margin_use
from memest.estimate.kv import hybrid_lengths
from memest.estimate.kv_groups import group_rows
from memest.estimate.phases import (
    TERM_FIELDS,
    TERM_LABELS,
    graph_pool_by_stage,
    terms_components,
)
from memest.estimate.startup_plan import graph_profiling_kept
from memest.schema import (
    EstimateComparison,
    EstimateRecord,
    KVGroupShare,
    KvSizedBy,
    RunReport,
    StartAccounting,
    VllmFigures,
)

#: Order of the estimator records in an accounting (and on every surface).
ESTIMATOR_ORDER = ("vllm", "memest", "memest-plan", "published", "measured")


def account(report: RunReport, *, margin_bytes: int = 0) -> StartAccounting:
    """The accounting of one start: recomputed when the report allows it, else as stored."""
    try:
        comparison = compare(report, margin_bytes=margin_bytes)
    except (MemestError, ValueError) as exc:
        # A figure the model cannot take (a negative stage growth, say) is a report memest
        # cannot recompute, never a failure of the surface showing it.
        return _stored(report, f"{exc}".splitlines()[0])
    return _current(report, comparison)


#: How reports written before RunReport.kv_sized_by said who sized the KV cache: the plugin's
#: note ("KV cache of this start sized by vllm"), or, older still, the measured record's note
#: ("this start, KV sized by memest: ...").
_SIZED_BY_NOTE = re.compile(r"KV (?:cache of this start )?sized by ([a-z-]+)")


def kv_sized_by(report: RunReport) -> KvSizedBy | None:
    """Who sized the start's KV cache: the plugin's record, else what an older report's notes say
    (the one place those notes are read), else None."""
    if report.kv_sized_by is not None:
        return report.kv_sized_by
    records = [] if report.estimate is None else report.estimate.records
    for text in [*report.notes, *(r.note for r in records if r.estimator == "measured")]:
        m = _SIZED_BY_NOTE.search(text)
        if m and m.group(1) in get_args(KvSizedBy):
            return cast(KvSizedBy, m.group(1))
    return None


def _first_per_estimator(records: list[EstimateRecord]) -> list[EstimateRecord]:
    """One record per estimator (the first), in ESTIMATOR_ORDER."""
    seen: dict[str, EstimateRecord] = {}
    for rec in records:
        seen.setdefault(rec.estimator, rec)
    rank = {name: i for i, name in enumerate(ESTIMATOR_ORDER)}
    return sorted(seen.values(), key=lambda r: rank.get(r.estimator, len(rank)))


def _stored_plan(report: RunReport, usage_minus_budget: int, kv_now: int) -> list[EstimateRecord]:
    """The plugin's startup-plan record, its predicted usage recomputed by today's usage.

    A plan start has this start's non-KV memory less what graph-memory profiling left
    allocated, and the plan's KV cache instead of this start's.
    """
    stored = [] if report.estimate is None else report.estimate.records
    plan = next((r for r in stored if r.estimator == "memest-plan"), None)
    if plan is None or plan.kv_cache_bytes is None:
        return []
    predicted = usage_minus_budget - graph_profiling_kept(report) + plan.kv_cache_bytes - kv_now
    return [plan.model_copy(update={"usage_minus_budget_bytes": predicted})]


def _capture_added(report: RunReport) -> int | None:
    if report.breakdown is None:
        return None
    rows = [p.total_added_bytes for p in report.breakdown.phases if p.phase == "capture"]
    return rows[-1] if rows else None


def _concurrency(report: RunReport, kv_tokens: int | None) -> float | None:
    length = report.config.max_model_len
    if kv_tokens is None or not length:
        return None
    return kv_tokens / length


def _kv_groups(report: RunReport, kv_bytes: int) -> list[KVGroupShare]:
    """A hybrid start's KV cache per group at its own lengths (none for one group)."""
    spec, c = report.kv_cache, report.config
    if spec is None or not spec.groups:
        return []
    lengths = hybrid_lengths(spec, c.max_model_len, c.max_num_batched_tokens)
    return group_rows(spec, kv_bytes, lengths)


def _current(report: RunReport, comparison: EstimateComparison) -> StartAccounting:
    terms = comparison.full_init
    measured = next(r for r in comparison.records if r.estimator == "measured")
    assert terms is not None and measured.usage_minus_budget_bytes is not None
    assert measured.kv_cache_bytes is not None and measured.non_kv_cache_bytes is not None
    budget = terms.requested_bytes
    usage = budget + measured.usage_minus_budget_bytes
    plan = _stored_plan(report, measured.usage_minus_budget_bytes, measured.kv_cache_bytes)
    figures = report.vllm
    spec = report.kv_cache
    return StartAccounting(
        report_id=report.report_id,
        kv_sized_by=kv_sized_by(report),
        usage_kind="end_of_init_plus_first_step_and_context_chunk"
        if terms.mla_context_bytes
        else "end_of_init_plus_first_step",
        budget_bytes=budget,
        usage_bytes=usage,
        usage_minus_budget_bytes=measured.usage_minus_budget_bytes,
        kv_cache_bytes=measured.kv_cache_bytes,
        kv_tokens=measured.kv_tokens,
        kv_blocks=spec.num_blocks if spec is not None else None,
        max_model_len=report.config.max_model_len,
        max_concurrency=_concurrency(report, measured.kv_tokens),
        kv_groups=_kv_groups(report, measured.kv_cache_bytes),
        non_kv_bytes=measured.non_kv_cache_bytes,
        graph_pool_bytes=terms.graph_pool_bytes,
        graph_pool_by_stage_bytes=terms.graph_pool_by_stage_bytes,
        capture_added_bytes=_capture_added(report),
        terms=terms,
        estimators=_first_per_estimator(comparison.records + plan),
        vllm_cudagraph_estimate_bytes=_vllm_graph_estimate(comparison.records, figures),
        vllm_cudagraph_logged_bytes=figures.cudagraph_estimate_bytes if figures else None,
        vllm_cudagraph_actual_bytes=figures.cudagraph_actual_bytes if figures else None,
        growable_kv=report_margin_use(report, terms),
    )


def _vllm_graph_estimate(records: list[EstimateRecord], figures: VllmFigures | None) -> int | None:
    """vLLM's graph estimate as the vllm estimator record has it (vLLM's rule applied to the graph
    profile this start recorded), else as vLLM logged it. In apply and plan starts vLLM profiles
    under memest's budget, so its logged figure can differ from what its rule gives alone."""
    rec = next((r for r in records if r.estimator == "vllm"), None)
    if rec is not None and rec.cudagraph_estimate_bytes is not None:
        return rec.cudagraph_estimate_bytes
    return figures.cudagraph_estimate_bytes if figures else None


def _stored_graph_pool(report: RunReport) -> tuple[int | None, dict[str, int]]:
    by_stage = graph_pool_by_stage(report)
    bd = report.breakdown
    if bd is not None and bd.graph_pool_growth_bytes:
        return bd.graph_pool_growth_bytes, by_stage
    if by_stage:
        return sum(by_stage.values()), by_stage
    split = None if bd is None else next((p for p in bd.phases if p.phase == "capture"), None)
    return (split.graph_pool_bytes if split is not None else None), by_stage


def _stored(report: RunReport, reason: str) -> StartAccounting:
    """The report's stored figures, flagged: its readings do not allow a recomputation."""
    records = _first_per_estimator([] if report.estimate is None else report.estimate.records)
    measured = next((r for r in records if r.estimator == "measured"), None)
    spec = report.kv_cache
    tokens = spec.kv_tokens if spec is not None else None
    if tokens is None and measured is not None:
        tokens = measured.kv_tokens
    pool, by_stage = _stored_graph_pool(report)
    figures = report.vllm
    return StartAccounting(
        report_id=report.report_id,
        definition="stored",
        kv_sized_by=kv_sized_by(report),
        definition_note="measured by an older definition: figures as stored in the report, "
        f"which memest cannot recompute ({reason})",
        usage_kind="end_of_init" if measured and measured.usage_minus_budget_bytes else None,
        budget_bytes=report.estimate.requested_bytes if report.estimate else None,
        usage_minus_budget_bytes=measured.usage_minus_budget_bytes if measured else None,
        kv_cache_bytes=measured.kv_cache_bytes if measured else None,
        kv_tokens=tokens,
        kv_blocks=spec.num_blocks if spec is not None else None,
        max_model_len=report.config.max_model_len,
        max_concurrency=_concurrency(report, tokens),
        non_kv_bytes=measured.non_kv_cache_bytes if measured else None,
        graph_pool_bytes=pool,
        graph_pool_by_stage_bytes=by_stage,
        capture_added_bytes=_capture_added(report),
        estimators=records,
        vllm_cudagraph_estimate_bytes=_vllm_graph_estimate(records, figures),
        vllm_cudagraph_logged_bytes=figures.cudagraph_estimate_bytes if figures else None,
        vllm_cudagraph_actual_bytes=figures.cudagraph_actual_bytes if figures else None,
        growable_kv=report_margin_use(report, None),
    )


#: The whole GPU as the run page draws it: each full-initialization term, each graph stage, the
#: KV cache, then what is left. Labels say what each part is for an operator.
GPU_PART_LABELS = {
    **{k: v for k, v in TERM_LABELS.items() if k in TERM_FIELDS},
    "kv_cache_bytes": "KV cache",
    "free_bytes": "free (not used)",
}


def gpu_parts(accounting: StartAccounting, total_bytes: int) -> list[tuple[str, str, int]]:
    """(key, label, bytes) from 0 to the GPU's total: memest's terms with the graph pool split by
    stage, the KV cache this start allocated, and the free rest (never negative).

    Empty when the accounting has no terms (a report measured by an older definition).
    """
    terms = accounting.terms
    if terms is None or accounting.kv_cache_bytes is None:
        return []
    parts: list[tuple[str, str, int]] = []
    for key, value in terms_components(terms).items():
        if key == "graph_pool_bytes":
            by_stage = terms.graph_pool_by_stage_bytes or {"graph pools": value}
            parts.extend((f"stage:{s}", f"graph pool · {s}", b) for s, b in by_stage.items())
        else:
            parts.append((key, GPU_PART_LABELS[key], value))
    parts.append(("kv_cache_bytes", GPU_PART_LABELS["kv_cache_bytes"], accounting.kv_cache_bytes))
    used = sum(b for _, _, b in parts)
    parts.append(("free_bytes", GPU_PART_LABELS["free_bytes"], max(total_bytes - used, 0)))
    return [p for p in parts if p[2] > 0]


#: The budget as an estimator splits it: what it holds back besides the KV cache (its CUDA-graph
#: estimate apart) and the KV cache it gives. The run page draws one thin bar per estimator under
#: the whole GPU, on the same scale.
BUDGET_PART_LABELS = {
    "non_kv_bytes": "non-KV besides graphs",
    "graph_bytes": "CUDA graphs",
    "kv_cache_bytes": "KV cache",
}
#: The estimators whose split the run page shows, and how it names them.
SPLIT_ESTIMATORS = {"vllm": "vLLM's estimate", "memest": "memest's estimate"}


@dataclass(frozen=True)
class BudgetSplit:
    """One estimator's split of the budget: ``parts`` (key, label, bytes) add up to what it
    requests, the KV cache last (it is the budget minus the rest, so they fill the budget
    unless the rest alone passes it)."""

    estimator: str
    label: str
    parts: list[tuple[str, str, int]]
    kv_tokens: int | None
    usage_minus_budget_bytes: int | None


def budget_split(accounting: StartAccounting, estimator: str) -> BudgetSplit | None:
    """How ``estimator`` splits the budget, or None when its record lacks a figure."""
    rec = accounting.estimator(estimator)
    if rec is None or estimator not in SPLIT_ESTIMATORS:
        return None
    non_kv, graphs = rec.non_kv_besides_graphs_bytes(), rec.cudagraph_estimate_bytes
    kv = rec.kv_cache_bytes
    if non_kv is None or graphs is None or kv is None:
        return None
    values = {"non_kv_bytes": non_kv, "graph_bytes": graphs, "kv_cache_bytes": kv}
    return BudgetSplit(
        estimator=estimator,
        label=SPLIT_ESTIMATORS[estimator],
        parts=[(key, BUDGET_PART_LABELS[key], value) for key, value in values.items()],
        kv_tokens=rec.kv_tokens,
        usage_minus_budget_bytes=rec.usage_minus_budget_bytes,
    )


def budget_splits(accounting: StartAccounting) -> list[BudgetSplit]:
    """vLLM's and memest's split of the budget (those with every figure), in that order."""
    splits = (budget_split(accounting, name) for name in SPLIT_ESTIMATORS)
    return [s for s in splits if s is not None]

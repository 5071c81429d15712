"""Tables for KV-budget estimates and what-if predictions (terminal text and markdown)."""

from __future__ import annotations

from memest.schema import EstimateComparison, WhatIf
from memest.units import fmt_gib


def _gib(value: int | None, *, signed: bool = False) -> str:
    return "-" if value is None else fmt_gib(value, signed=signed)


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_comparison(comparison: EstimateComparison) -> str:
    """Estimators side by side, then the full-initialization terms (GiB)."""
    out = [f"Budget (requested): {_gib(comparison.requested_bytes)} GiB\n\n"]
    rows = [
        [
            r.estimator,
            _gib(r.cudagraph_estimate_bytes),
            _gib(r.non_kv_cache_bytes),
            _gib(r.kv_cache_bytes),
            _int(r.kv_tokens),
            _gib(r.usage_minus_budget_bytes, signed=True),
        ]
        for r in comparison.records
    ]
    header = [
        "estimator",
        "graph memory GiB",
        "non-KV GiB",
        "KV GiB",
        "KV tokens",
        "usage - budget GiB",
    ]
    out.append(_table(header, rows))
    if comparison.components:
        out.append("\nFull-initialization terms (memest)\n\n")
        terms = [
            [name.removesuffix("_bytes"), _gib(v)] for name, v in comparison.components.items()
        ]
        out.append(_table(["term", "GiB"], terms))
    if comparison.full_init is not None and comparison.full_init.graph_pool_by_stage_bytes:
        out.append("\nGraph pool by stage (reservation)\n\n")
        stages = [
            [stage, _gib(v)] for stage, v in comparison.full_init.graph_pool_by_stage_bytes.items()
        ]
        out.append(_table(["stage", "GiB"], stages))
    return "".join(out)


def render_what_if(what_if: WhatIf) -> str:
    """Per-owner pool memory under G and predicted under G', and the KV budget."""
    out = [f"G : {what_if.grid_from}\nG': {what_if.grid_to}\n\n"]
    rows = [
        [
            p.stage,
            p.owner,
            p.law,
            _gib(p.measured_bytes),
            f"{p.factor:.3f}",
            _gib(p.predicted_bytes),
            p.note,
        ]
        for p in what_if.owners
    ]
    out.append(_table(["stage", "owner", "scales with", "G GiB", "factor", "G' GiB", "note"], rows))
    out.append(
        f"\nGraph pool: {_gib(what_if.graph_pool_bytes_from)} -> "
        f"{_gib(what_if.graph_pool_bytes_to)} GiB\n"
        f"KV budget: {_gib(what_if.kv_budget_bytes_from)} -> {_gib(what_if.kv_budget_bytes_to)} GiB"
        f" ({_int(what_if.kv_tokens_from)} -> {_int(what_if.kv_tokens_to)} tokens)\n"
    )
    if what_if.dominant_owner is not None:
        out.append(
            f"Dominant change: {what_if.dominant_owner} "
            f"({_gib(what_if.dominant_change_bytes, signed=True)} GiB)\n"
        )
    for note in what_if.notes:
        out.append(f"Note: {note}\n")
    return "".join(out)

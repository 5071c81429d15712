"""Tables for KV-budget estimates and what-if predictions (terminal text and markdown)."""

from __future__ import annotations

from memest.estimate.phases import TERM_FIELDS, TERM_LABELS
from memest.reporters.preflight import growable_line
from memest.reporters.table import Table, markdown_grid
from memest.reporters.views import FAMILY_TERMS
from memest.schema import EstimateRecord, StartAccounting, WhatIf
from memest.units import concurrency_text, count_cell, gib_cell, ratio_cell


def _gib(value: int | None, *, signed: bool = False) -> str:
    return gib_cell(value, signed=signed)


_int = count_cell


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table without a heading (the text before it says what it holds)."""
    return "\n".join(markdown_grid(Table("", header, rows))) + "\n"


def _summary(acc: StartAccounting) -> str:
    usage = {
        "end_of_init_plus_first_step": "end of init + serving's first full-size step",
        "end_of_init_plus_first_step_and_context_chunk": "end of init + serving's first "
        "full-size step + MLA's prefill up-projection",
        "end_of_init": "end of init",
    }.get(acc.usage_kind or "", "unknown")
    lines = [
        f"Budget (requested): {_gib(acc.budget_bytes)} GiB",
        f"Usage ({usage}): {_gib(acc.usage_bytes)} GiB, "
        f"usage - budget {_gib(acc.usage_minus_budget_bytes, signed=True)} GiB",
        f"KV cache: {_gib(acc.kv_cache_bytes)} GiB, {_int(acc.kv_tokens)} tokens, "
        f"max concurrency {concurrency_text(acc.max_concurrency, acc.max_model_len)}",
        f"Non-KV: {_gib(acc.non_kv_bytes)} GiB; graph pool {_gib(acc.graph_pool_bytes)} GiB",
    ]
    if acc.definition == "stored":
        lines.append(f"Note: {acc.definition_note}")
    return "\n".join(lines) + "\n\n"


def _estimator_rows(records: list[EstimateRecord]) -> list[list[str]]:
    return [
        [
            r.estimator,
            _gib(r.cudagraph_estimate_bytes),
            _gib(r.non_kv_besides_graphs_bytes()),
            _gib(r.kv_cache_bytes),
            _int(r.kv_tokens),
            _gib(r.usage_minus_budget_bytes, signed=True),
        ]
        for r in records
    ]


def render_accounting(acc: StartAccounting) -> str:
    """The start's figures, the estimators side by side, then the full-initialization terms."""
    header = [
        "estimator",
        "graph memory GiB",
        "non-KV besides graphs GiB",
        "KV GiB",
        "KV tokens",
        "usage - budget GiB",
    ]
    out = [_summary(acc), _table(header, _estimator_rows(acc.estimators))]
    if acc.terms is not None:
        out.append("\nFull-initialization terms (memest)\n\n")
        terms = acc.terms.model_dump(include=set(TERM_FIELDS))
        rows = [
            [TERM_LABELS[name], _gib(terms[name])]
            for name in TERM_FIELDS
            if terms[name] or name not in FAMILY_TERMS  # no zero MLA row for a dense model
        ]
        out.append(_table(["term", "GiB"], rows))
    if acc.graph_pool_by_stage_bytes:
        out.append("\nGraph pool by stage (reservation)\n\n")
        stages = [[stage, _gib(v)] for stage, v in acc.graph_pool_by_stage_bytes.items()]
        out.append(_table(["stage", "GiB"], stages))
    return "".join(out)


def render_what_if(what_if: WhatIf) -> str:
    """Per-owner pool memory under G and predicted under G', and the KV budget."""
    release = f" (vLLM {what_if.vllm_version_to}'s rules)" if what_if.vllm_version_to else ""
    out = [f"G : {what_if.grid_from}\nG': {what_if.grid_to}{release}\n\n"]
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
    if what_if.concurrency_from is not None or what_if.concurrency_to is not None:
        out.append(
            f"Requests at max_model_len: {ratio_cell(what_if.concurrency_from)} at "
            f"{_int(what_if.max_model_len_from)} -> {ratio_cell(what_if.concurrency_to)} at "
            f"{_int(what_if.max_model_len_to)}\n"
        )
    if what_if.dominant_owner is not None:
        out.append(
            f"Dominant change: {what_if.dominant_owner} "
            f"({_gib(what_if.dominant_change_bytes, signed=True)} GiB)\n"
        )
    if what_if.growable_kv_to is not None and what_if.vllm_version_to is not None:
        out.append(f"At G': {growable_line(what_if.vllm_version_to, what_if.growable_kv_to)}\n")
    for note in what_if.notes:
        out.append(f"Note: {note}\n")
    return "".join(out)

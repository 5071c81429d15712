"""A hybrid model's KV cache per group: one table every surface shows (CLI, run page, report).

The figures are memest.estimate.kv_groups.group_rows' (StartAccounting.kv_groups for a start);
this module only formats them.
"""

from __future__ import annotations

from collections.abc import Sequence

from memest.reporters.table import Table
from memest.schema import KVGroupShare
from memest.units import fmt_gib

#: How each group kind reads.
KIND_LABELS = {
    "full_attention": "full attention",
    "sliding_window": "sliding window",
    "chunked_local": "chunked local attention",
    "mla": "MLA",
    "mamba": "linear attention / Mamba state",
}
HEADER = [
    "group",
    "layers",
    "block",
    "blocks / request",
    "share of budget",
    "GiB",
    "tokens / request",
    "tokens held",
]
NOTE = (
    "every group draws its blocks from one pool; a request at max_model_len takes each group's "
    "blocks, so its share of the budget is its blocks over their sum: a sliding window keeps "
    "window - 1 + in-flight tokens, a state group a fixed number of states"
)


def group_label(row: KVGroupShare) -> str:
    """A group's kind as every surface names it (its window for a sliding-window group)."""
    label = KIND_LABELS.get(row.kind, row.kind)
    return f"{label} ({row.sliding_window:,})" if row.sliding_window else label


def _cells(r: KVGroupShare) -> list[str]:
    return [
        group_label(r),
        str(r.num_layers),
        str(r.block_size),
        f"{r.blocks_per_request:,}",
        f"{r.share:.1%}",
        fmt_gib(r.kv_bytes),
        "state" if r.tokens_per_request is None else f"{r.tokens_per_request:,}",
        "—" if r.tokens is None else f"{r.tokens:,}",
    ]


def kv_groups_table(rows: Sequence[KVGroupShare], max_model_len: int | None) -> Table | None:
    """The per-group table of a hybrid's KV cache (None for one group)."""
    if not rows:
        return None
    at = f", max_model_len {max_model_len:,}" if max_model_len else ""
    return Table(
        title=f"KV cache per group ({len(rows)} groups{at})",
        header=HEADER,
        rows=[_cells(r) for r in rows],
        notes=[NOTE],
        align=(None, "right", "right", "right", "right", "right", "right", "right"),
    )

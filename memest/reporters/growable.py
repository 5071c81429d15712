"""vLLM 0.34's growable KV cache beside memest's terms: one table every surface shows (CLI, run
page). The figures are memest.estimate.growable.margin_use's (StartAccounting.growable_kv); this
module only formats them.
"""

from __future__ import annotations

from memest.reporters.table import Table
from memest.schema import GrowableKvMargin
from memest.units import gib_cell

HEADER = ["figure", "GiB"]
NOTE = (
    "vLLM keeps free what it counted for serving's transients plus its margin; memest's need "
    "beyond what vLLM counted comes out of the margin, and the rest is what memest expects "
    "serving's peak to leave unused (negative: the margin falls short)"
)


def growable_rows(g: GrowableKvMargin) -> list[tuple[str, str, int | None]]:
    """(key, label, bytes) of each figure, in the order every surface shows them."""
    sized = "memest's figures (apply)" if g.sized_by == "memest" else "vLLM's margin"
    return [
        ("committed_kv_bytes", f"KV cache committed, sized by {sized}", g.committed_kv_bytes),
        ("vllm_transient_bytes", "vLLM's counted transient (kept free)", g.vllm_transient_bytes),
        ("vllm_margin_bytes", "vLLM's margin (kept free beyond it)", g.vllm_margin_bytes),
        ("memest_need_bytes", "memest's measured need (transient)", g.memest_need_bytes),
        (
            "memest_need_beyond_vllm_bytes",
            "memest's need beyond what vLLM counted",
            g.memest_need_beyond_vllm_bytes,
        ),
        ("margin_unused_bytes", "vLLM's margin memest expects unused", g.margin_unused_bytes),
    ]


def growable_table(g: GrowableKvMargin | None) -> Table | None:
    """The growable cache's table (None where the start's KV cache was not growable)."""
    if g is None:
        return None
    rows = [
        [label, gib_cell(value, signed=key == "margin_unused_bytes")]
        for key, label, value in growable_rows(g)
    ]
    return Table(
        title="vLLM 0.34 growable KV cache: margin used",
        header=HEADER,
        rows=rows,
        notes=[NOTE],
        align=(None, "right"),
    )

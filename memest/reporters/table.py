"""One table model and its three renderings: markdown, HTML and aligned plain text.

Every table a surface prints (``memest report``, ``analyze``, ``estimate``, ``plan``, the ranks
table) is built once as a :class:`Table` of ready-formatted cells and rendered here, so the
markdown, the standalone HTML and the terminal text of one table always show the same cells.
This module only lays cells out; the cells' figures come formatted from ``memest.units``.

A cell written ``**text**`` is emphasised: markdown keeps the marks, HTML makes it ``<strong>``,
plain text drops the marks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Literal

#: How a column's cells line up; None leaves it to the renderer's default (left, or the page's
#: CSS in HTML).
Align = Literal["left", "right"] | None


@dataclass(frozen=True)
class Table:
    """A titled table of formatted cells, with optional notes printed under it."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    align: tuple[Align, ...] = field(
        default=(), metadata={"doc": "Per column; shorter than the header: the rest default"}
    )

    def column_align(self, index: int) -> Align:
        return self.align[index] if index < len(self.align) else None


def _strong(text: str) -> str | None:
    """The emphasised text of a ``**text**`` cell, else None."""
    if text.startswith("**") and text.endswith("**") and len(text) > 4:
        return text[2:-2]
    return None


# --- markdown ---------------------------------------------------------------------------------


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _md_rule(table: Table) -> str:
    marks = {None: "---", "left": ":---", "right": "---:"}
    return "|" + "|".join(marks[table.column_align(i)] for i in range(len(table.header))) + "|"


def markdown_grid(table: Table) -> list[str]:
    """The table's header, rule and rows as markdown lines (pipes in cells escaped)."""
    return [_md_row(table.header), _md_rule(table), *(_md_row(r) for r in table.rows)]


def markdown_lines(tables: Sequence[Table]) -> list[str]:
    """Each table under a ``###`` heading of its title, its notes as paragraphs after it."""
    parts: list[str] = []
    for t in tables:
        parts.append(f"### {t.title}\n")
        parts += markdown_grid(t)
        parts.append("")
        parts += [f"{n}\n" for n in t.notes]
    return parts


def to_markdown(tables: Sequence[Table]) -> str:
    """The tables as one markdown text (``markdown_lines`` joined)."""
    return "\n".join(markdown_lines(tables))


# --- HTML -------------------------------------------------------------------------------------


def _html_cell(text: str) -> str:
    strong = _strong(text)
    return escape(text) if strong is None else f"<strong>{escape(strong)}</strong>"


def _td(table: Table, index: int, text: str) -> str:
    align = table.column_align(index)
    style = "" if align is None else f' style="text-align:{align}"'
    return f"<td{style}>{_html_cell(text)}</td>"


def to_html(tables: Sequence[Table]) -> str:
    """Each table under an ``<h2>`` of its title, notes as ``<p class="meta">`` after it."""
    parts = []
    for t in tables:
        parts.append(f"<h2>{escape(t.title)}</h2><table><thead><tr>")
        parts.extend(f"<th>{escape(h)}</th>" for h in t.header)
        parts.append("</tr></thead><tbody>")
        for row in t.rows:
            parts.append("<tr>" + "".join(_td(t, i, c) for i, c in enumerate(row)) + "</tr>")
        parts.append("</tbody></table>")
        parts.extend(f'<p class="meta">{escape(n)}</p>' for n in t.notes)
    return "".join(parts)


# --- plain text -------------------------------------------------------------------------------


def _plain(text: str) -> str:
    strong = _strong(text)
    return text if strong is None else strong


def text_grid(table: Table) -> list[str]:
    """The header, a rule of dashes and the rows, each column padded to its widest cell and
    two spaces apart (right-aligned columns padded on the left); trailing spaces dropped."""
    header = [_plain(c) for c in table.header]
    rows = [[_plain(c) for c in r] for r in table.rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = (
            c.rjust(w) if table.column_align(i) == "right" else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        )
        return "  ".join(padded).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def text_lines(tables: Sequence[Table]) -> list[str]:
    """Each table after a line with its title, its notes after it, a blank line between."""
    parts: list[str] = []
    for t in tables:
        parts += [t.title, *text_grid(t), *t.notes, ""]
    return parts


def to_text(tables: Sequence[Table]) -> str:
    """The tables as one plain text (``text_lines`` joined)."""
    return "\n".join(text_lines(tables))

"""The one table model: the same cells as markdown, HTML and aligned text."""

from __future__ import annotations

from memest.reporters.table import Table, to_html, to_markdown, to_text

TABLE = Table(
    "Pools",
    ["pool", "GiB"],
    [["a|b", "1.5"], ["**Total**", "12.25"]],
    notes=["† a note"],
    align=(None, "right"),
)


def test_markdown_escapes_pipes_and_marks_right_aligned_columns() -> None:
    assert to_markdown([TABLE]) == (
        "### Pools\n\n| pool | GiB |\n|---|---:|\n| a\\|b | 1.5 |\n| **Total** | 12.25 |\n\n† a note\n"
    )


def test_html_escapes_cells_and_makes_marked_cells_strong() -> None:
    assert to_html([TABLE]) == (
        "<h2>Pools</h2><table><thead><tr><th>pool</th><th>GiB</th></tr></thead><tbody>"
        '<tr><td>a|b</td><td style="text-align:right">1.5</td></tr>'
        '<tr><td><strong>Total</strong></td><td style="text-align:right">12.25</td></tr>'
        '</tbody></table><p class="meta">† a note</p>'
    )


def test_text_pads_columns_to_their_widest_cell_and_drops_the_marks() -> None:
    # widths: "pool"/"a|b"/"Total" -> 5, "GiB"/"1.5"/"12.25" -> 5; two spaces between columns
    assert to_text([TABLE]).splitlines() == [
        "Pools",
        "pool     GiB",
        "-----  -----",
        "a|b      1.5",
        "Total  12.25",
        "† a note",
    ]


def test_a_table_without_alignment_renders_with_the_defaults() -> None:
    plain = Table("t", ["x", "y"], [["1", "22"]])
    assert to_markdown([plain]).splitlines()[3] == "|---|---|"
    assert "<td>22</td>" in to_html([plain])
    assert to_text([plain]) == "t\nx  y\n-  --\n1  22\n"

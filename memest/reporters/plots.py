"""Plots without network or JavaScript: hand-written SVG (dashboard and reports) and, when
matplotlib is installed, PNG of the same figures: a run's stage x owner bars and two runs' paired
bars. A model's history is drawn by plots_history.py, the whole GPU by plots_gpu.py.

Every drawn value carries ``data-*`` attributes with its exact bytes, so a page's numbers can be
checked against the API.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from memest.analysis.stages import StageBar
from memest.builds.compare import Comparison
from memest.reporters.owners import owner_color, owner_label
from memest.reporters.svg import (
    A_COLOR,
    B_COLOR,
    nice_max,
    nice_ticks,
    short_label,
    svg_open,
    tick_text,
)
from memest.units import GiB, fmt_gib

__all__ = ["owner_color", "owner_label"]


@dataclass
class _LegendEntry:
    label: str
    color: str
    bytes: int = 0
    owners: list[str] = field(default_factory=list)


def _owner_legend(bars: Sequence[StageBar]) -> list[_LegendEntry]:
    """One entry per owner label (Inductor's hashed names share one), largest first."""
    entries: dict[str, _LegendEntry] = {}
    for bar in bars:
        for seg in bar.owners:
            label = owner_label(seg.owner)
            e = entries.setdefault(label, _LegendEntry(label, owner_color(seg.owner)))
            e.bytes += seg.bytes
            if seg.owner not in e.owners:
                e.owners.append(seg.owner)
    return sorted(entries.values(), key=lambda e: -e.bytes)


def _stage_row(bar: StageBar, y: float, left: int, row_h: int, scale: float) -> list[str]:
    """One horizontal stacked bar: the stage's label, a segment per owner, its total."""
    graphs = f"{bar.graph_count} graphs" if bar.graph_count is not None else ""
    sub = " · ".join(x for x in (graphs, f"widest {bar.widest}" if bar.widest else "") if x)
    out = [
        f'<g class="stage-bar" data-stage="{escape(bar.stage)}" '
        f'data-bytes="{bar.pool_growth_bytes}">',
        f'<text x="{left - 10}" y="{y + row_h / 2 - 1:.1f}" text-anchor="end" '
        f'font-weight="bold">{escape(bar.stage)}</text>',
        f'<text x="{left - 10}" y="{y + row_h / 2 + 12:.1f}" text-anchor="end" font-size="10" '
        f'fill="#616e7c">{escape(sub)}</text>',
    ]
    x = float(left)
    for seg in bar.owners:
        w = seg.bytes * scale
        label = owner_label(seg.owner)
        out.append(
            f'<rect class="owner-seg" x="{x:.2f}" y="{y:.1f}" width="{max(w, 0):.2f}" '
            f'height="{row_h}" fill="{owner_color(seg.owner)}" stroke="#fff" stroke-width="0.5" '
            f'data-owner="{escape(seg.owner)}" data-label="{escape(label)}" '
            f'data-bytes="{seg.bytes}"><title>{escape(bar.stage)} · {escape(label)}: '
            f"{fmt_gib(seg.bytes)} GiB ({escape(seg.owner)})</title></rect>"
        )
        x += w
    total = (
        f"{fmt_gib(bar.pool_growth_bytes)} GiB"
        if bar.pool_growth_bytes
        else "0: no new pool memory (reused the pool)"
    )
    out.append(
        f'<text class="bar-total" x="{x + 6:.1f}" y="{y + row_h / 2 + 4:.1f}">{total}</text></g>'
    )
    return out


def stage_owner_svg(bars: Sequence[StageBar], title: str = "Added graph-pool memory") -> str:
    """Horizontal stacked bars: one row per capture stage, one segment per owner (GiB).

    The legend names each owner by what it is (owner_label) with its GiB over all stages; the
    raw owner names are in each segment's and legend entry's tooltip.
    """
    width, left, right, top, row_h, gap = 1100, 190, 230, 48, 26, 16
    plot_w = width - left - right
    legend = _owner_legend(bars)
    cols = 2  # a 60-character label and its GiB fit a half-width column, never a third
    legend_top = top + len(bars) * (row_h + gap) + 18
    height = legend_top + ((len(legend) + cols - 1) // cols) * 20 + 8
    max_gib = nice_max(max((b.pool_growth_bytes / GiB for b in bars), default=0))
    scale = plot_w / (max_gib * GiB)
    out = svg_open(width, height, title, "stage-owner")
    out.append(f'<text x="0" y="18" font-size="14" font-weight="bold">{escape(title)} (GiB)</text>')
    ticks = nice_ticks(0.0, max_gib)
    for v in ticks:
        x = left + v * GiB * scale
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 8}" y2="{legend_top - 18}" '
            f'stroke="#e5e5e5"/><text x="{x:.1f}" y="{top - 12}" text-anchor="middle" '
            f'font-size="10" fill="#616e7c">{tick_text(v, ticks[1] - ticks[0], "GiB")}</text>'
        )
    for i, bar in enumerate(bars):
        out += _stage_row(bar, top + i * (row_h + gap), left, row_h, scale)
    col_w = width / cols
    for j, e in enumerate(legend):
        lx, ly = (j % cols) * col_w, legend_top + (j // cols) * 20
        out.append(
            f'<g class="legend-entry" data-label="{escape(e.label)}" data-bytes="{e.bytes}">'
            f'<rect x="{lx:.1f}" y="{ly}" width="12" height="12" fill="{e.color}"/>'
            f'<text x="{lx + 18:.1f}" y="{ly + 10}">{escape(short_label(e.label, 60))} · '
            f"{fmt_gib(e.bytes)} GiB<title>{escape(', '.join(e.owners))}</title></text></g>"
        )
    out.append("</svg>")
    return "".join(out)


def compare_svg(cmp: Comparison, title: str = "Graph-pool growth per stage") -> str:
    """Paired horizontal bars per stage: run A above run B (GiB)."""
    rows = [d for d in cmp.stages if d.key != "total"]
    width, left, right, top, bar_h = 640, 150, 70, 64, 14
    plot_w = width - left - right
    slot = 2 * bar_h + 14
    height = top + len(rows) * slot + 10
    max_gib = nice_max(max(((max(d.a or 0, d.b or 0)) / GiB for d in rows), default=0))
    scale = plot_w / (max_gib * GiB)
    out = svg_open(width, height, title, "compare")
    out.append(f'<text x="0" y="18" font-size="14" font-weight="bold">{escape(title)} (GiB)</text>')
    for j, (name, color) in enumerate(((cmp.a_name, A_COLOR), (cmp.b_name, B_COLOR))):
        lx = left + j * 200
        out.append(
            f'<rect x="{lx}" y="30" width="12" height="12" fill="{color}"/>'
            f'<text x="{lx + 18}" y="40">{escape(short_label(name, 28))}</text>'
        )
    ticks = nice_ticks(0.0, max_gib)
    for v in ticks:
        x = left + v * GiB * scale
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 6}" y2="{height - 10}" stroke="#e5e5e5"/>'
            f'<text x="{x:.1f}" y="{top - 8}" text-anchor="middle" font-size="10" '
            f'fill="#616e7c">{tick_text(v, ticks[1] - ticks[0], "GiB")}</text>'
        )
    for i, d in enumerate(rows):
        y0 = top + i * slot
        out.append(
            f'<text x="{left - 8}" y="{y0 + bar_h + 4}" text-anchor="end">{escape(d.key)}</text>'
        )
        for k, (side, val, color) in enumerate((("a", d.a, A_COLOR), ("b", d.b, B_COLOR))):
            y = y0 + k * bar_h
            if val is None:
                out.append(
                    f'<text x="{left + 4}" y="{y + bar_h - 3}" font-size="10" fill="#616e7c">'
                    "not captured</text>"
                )
                continue
            w = val * scale
            out.append(
                f'<rect class="cmp-bar" x="{left}" y="{y}" width="{w:.1f}" height="{bar_h - 1}" '
                f'fill="{color}" data-stage="{escape(d.key)}" data-side="{side}" '
                f'data-bytes="{val}"><title>{escape(d.key)} {side.upper()}: {fmt_gib(val)} GiB'
                f"</title></rect>"
                f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 3}" font-size="10">'
                f"{fmt_gib(val)}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def save_png_stage_owner(bars: Sequence[StageBar], path: Path, title: str) -> Path:
    """The stacked stage x owner bars as a PNG (matplotlib, Agg backend), owners by label.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.55 * max(len(bars), 1)))
    seen: set[str] = set()
    for i, bar in enumerate(bars):
        left = 0.0
        for seg in bar.owners:
            w = seg.bytes / GiB
            label = owner_label(seg.owner)
            ax.barh(
                i,
                w,
                left=left,
                color=owner_color(seg.owner),
                label=None if label in seen else label,
            )
            seen.add(label)
            left += w
        text = f" {fmt_gib(bar.pool_growth_bytes)}" if bar.pool_growth_bytes else " 0: reused"
        ax.text(left, i, text, va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [b.stage for b in bars])
    ax.invert_yaxis()
    ax.set_xlabel("GiB")
    ax.set_title(textwrap.fill(title, 100), fontsize=10)
    if seen:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_png_compare(cmp: Comparison, path: Path, title: str) -> Path:
    """Paired per-stage bars of a comparison as a PNG (matplotlib, Agg backend).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [d for d in cmp.stages if d.key != "total"]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.6 * max(len(rows), 1)))
    ys = range(len(rows))
    for side, name, color, dy in (
        ("a", cmp.a_name, A_COLOR, -0.2),
        ("b", cmp.b_name, B_COLOR, 0.2),
    ):
        vals = [getattr(d, side) for d in rows]
        ax.barh([y + dy for y in ys], [(v or 0) / GiB for v in vals], 0.4, label=name, color=color)
    ax.set_yticks(list(ys), [d.key for d in rows])
    ax.invert_yaxis()
    ax.set_xlabel("GiB")
    ax.set_title(textwrap.fill(title, 100), fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Plots without network or JavaScript: hand-written SVG (dashboard and reports) and, when
matplotlib is installed, PNG of the same figures.

Every drawn value carries ``data-*`` attributes with its exact bytes, so a page's numbers can be
checked against the API.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from memest.analysis.compare import Comparison
from memest.analysis.history import History
from memest.analysis.stages import StageBar
from memest.estimate import BudgetSplit
from memest.reporters.owners import owner_color, owner_label
from memest.units import GiB, fmt_gib

__all__ = ["owner_color", "owner_label"]

_A_COLOR = "#9e9e9e"
_B_COLOR = "#2471a3"
_BAD = "#c0392b"
#: One colour per configuration of a model's history (series), in order of first appearance.
SERIES_COLORS = ("#2471a3", "#e67e22", "#27ae60", "#8e44ad", "#16a085", "#c2185b", "#7f8c8d")


def series_color(index: int) -> str:
    """The colour of history series ``index`` (a configuration fingerprint)."""
    return SERIES_COLORS[index % len(SERIES_COLORS)]


def _short(label: str, limit: int = 34) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _nice_max(value: float) -> float:
    """The top of a GiB axis: the first of 4 nice steps (1, 2, 2.5, 5 x 10^k) above ``value``."""
    ticks = nice_ticks(0.0, value)
    return ticks[-1] if value > 0 else 1.0


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` ticks at a nice step (1, 2, 2.5 or 5 x 10^k) covering [lo, hi]."""
    if hi <= lo:
        pad = abs(hi) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    start = math.floor(lo / step + 1e-9) * step
    n = math.ceil((hi - start) / step - 1e-9)
    return [start + i * step for i in range(n + 1)]


def tick_text(value: float, step: float, unit: str) -> str:
    """A tick's text, with just the decimals its step needs (tokens in k or M)."""
    div, suffix = 1.0, ""
    if unit == "tokens" and step >= 100:
        div, suffix = (1e6, "M") if step >= 1e6 else (1e3, "k")
    scaled = step / div
    digits = next((d for d in range(7) if abs(round(scaled, d) - scaled) < scaled * 1e-6), 6)
    v = value / div
    if abs(v) < scaled / 1e6:
        return f"{0:.{digits}f}"
    return f"{v:.{digits}f}{suffix}"


def _svg_open(width: int, height: int, title: str, cls: str = "", **data: str) -> list[str]:
    attrs = "".join(f' data-{k}="{escape(v)}"' for k, v in data.items())
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="memest-plot {cls}" role="img"{attrs} '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
    ]


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
    max_gib = _nice_max(max((b.pool_growth_bytes / GiB for b in bars), default=0))
    scale = plot_w / (max_gib * GiB)
    out = _svg_open(width, height, title, "stage-owner")
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
            f'<text x="{lx + 18:.1f}" y="{ly + 10}">{escape(_short(e.label, 60))} · '
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
    max_gib = _nice_max(max(((max(d.a or 0, d.b or 0)) / GiB for d in rows), default=0))
    scale = plot_w / (max_gib * GiB)
    out = _svg_open(width, height, title, "compare")
    out.append(f'<text x="0" y="18" font-size="14" font-weight="bold">{escape(title)} (GiB)</text>')
    for j, (name, color) in enumerate(((cmp.a_name, _A_COLOR), (cmp.b_name, _B_COLOR))):
        lx = left + j * 200
        out.append(
            f'<rect x="{lx}" y="30" width="12" height="12" fill="{color}"/>'
            f'<text x="{lx + 18}" y="40">{escape(_short(name, 28))}</text>'
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
        for k, (side, val, color) in enumerate((("a", d.a, _A_COLOR), ("b", d.b, _B_COLOR))):
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


@dataclass(frozen=True)
class _Axis:
    """A value axis: its ticks and the mapping from value to y."""

    ticks: list[float]
    top: float
    height: float

    def y(self, v: float) -> float:
        lo, hi = self.ticks[0], self.ticks[-1]
        return self.top + self.height - self.height * (v - lo) / (hi - lo)


def _axis(values: Sequence[float], top: float, height: float, zero: bool) -> _Axis:
    """Ticks around the values (0 kept on the axis when ``zero``), padded by 8 % of their span."""
    lo, hi = min(values, default=0.0), max(values, default=1.0)
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.02 or 1.0
    lo = lo if zero and lo == 0 else lo - pad
    hi = hi if zero and hi == 0 else hi + pad
    return _Axis(nice_ticks(lo, hi), top, height)


def series_svg(
    labels: Sequence[str],
    values: Sequence[float | None],
    bad: Sequence[bool],
    *,
    title: str,
    unit: str,
    metric: str,
    raw: Sequence[int | None],
    series: Sequence[int] = (),
    zero: bool = False,
    titles: Sequence[str] = (),
) -> str:
    """A history metric: one line per configuration (``series``); regressions are red rings.

    Ticks fall on nice steps of the unit; ``zero`` keeps 0 on the axis (signed figures);
    ``titles`` (default: the labels) are the points' tooltips.
    """
    # Room under the axis for the rotated x labels (short labels such as #3 need little).
    bottom = min(112, 36 + 6 * max((len(label) for label in labels), default=0))
    width, left, right, top, plot_h = 440, 84, 14, 34, 154
    height, plot_w = top + plot_h + bottom, width - left - right
    groups = list(series) if series else [0] * len(values)
    axis = _axis([v for v in values if v is not None], top, plot_h, zero)
    step = axis.ticks[1] - axis.ticks[0]
    out = _svg_open(width, height, title, "history", metric=metric)
    out.append(
        f'<text x="0" y="18" font-size="13" font-weight="bold">{escape(title)} '
        f"({escape(unit)})</text>"
    )
    for v in axis.ticks:
        yv = axis.y(v)
        stroke = "#999" if v == 0 and zero else "#e5e5e5"
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{yv:.1f}" y2="{yv:.1f}" '
            f'stroke="{stroke}"/><text x="{left - 6}" y="{yv + 4:.1f}" text-anchor="end" '
            f'font-size="10">{tick_text(v, step, unit)}</text>'
        )
    n = len(labels)
    xs = [left + plot_w * (i + 0.5) / max(n, 1) for i in range(n)]
    for g in sorted(set(groups)):
        pts = [
            f"{x:.1f},{axis.y(v):.1f}"
            for x, v, s in zip(xs, values, groups, strict=True)
            if v is not None and s == g
        ]
        if len(pts) > 1:
            out.append(
                f'<polyline points="{" ".join(pts)}" fill="none" stroke="{series_color(g)}" '
                'stroke-width="2"/>'
            )
    names = list(titles) if titles else list(labels)
    out += _history_points(labels, names, values, bad, raw, groups, xs, axis, top + plot_h)
    out.append("</svg>")
    return "".join(out)


def _history_points(
    labels: Sequence[str],
    titles: Sequence[str],
    values: Sequence[float | None],
    bad: Sequence[bool],
    raw: Sequence[int | None],
    groups: Sequence[int],
    xs: Sequence[float],
    axis: _Axis,
    base_y: float,
) -> list[str]:
    """Each run's point (a red ring when it regressed) and its rotated x label."""
    out = []
    last_label = -1e9
    for i, (x, val) in enumerate(zip(xs, values, strict=True)):
        if x - last_label >= 14:  # skip labels that would overlap their neighbour
            last_label = x
            ly = base_y + 10
            out.append(
                f'<text x="{x:.1f}" y="{ly:.1f}" text-anchor="end" font-size="10" '
                f'transform="rotate(-40 {x:.1f} {ly:.1f})">{escape(_short(labels[i], 20))}'
                f"<title>{escape(titles[i])}</title></text>"
            )
        if val is None:
            continue
        color = series_color(groups[i])
        ring = f' stroke="{_BAD}" stroke-width="3"' if bad[i] else ""
        out.append(
            f'<circle class="point{" regression" if bad[i] else ""}" cx="{x:.1f}" '
            f'cy="{axis.y(val):.1f}" r="{6 if bad[i] else 4}" fill="{color}"{ring} '
            f'data-value="{raw[i]}"><title>{escape(titles[i])}: {val:,.3f}</title></circle>'
        )
    return out


def history_labels(hist: History) -> list[str]:
    """x labels: the build when every run has its own and it is short, else the run's number on
    the page (#1 oldest; the history table numbers its rows the same way). Each point's run id
    is its tooltip."""
    builds = [p.build for p in hist.points]
    if all(builds) and len(set(builds)) == len(builds) and max(map(len, builds)) <= 16:
        return builds
    return [f"#{i}" for i in range(1, len(hist.points) + 1)]


def history_svgs(hist: History) -> dict[str, str]:
    """The history page's three series: KV tokens, graph-pool GiB, estimator error GiB."""
    labels = history_labels(hist)
    groups = [p.series for p in hist.points]

    def one(
        metric: str,
        raw: list[int | None],
        to_unit: Callable[[int], float],
        title: str,
        unit: str,
        zero: bool = False,
    ) -> str:
        return series_svg(
            labels,
            [to_unit(v) if v is not None else None for v in raw],
            [metric in p.regressions for p in hist.points],
            title=title,
            unit=unit,
            metric=metric,
            raw=raw,
            series=groups,
            zero=zero,
            titles=[p.run_id for p in hist.points],
        )

    def gib(v: int) -> float:
        return v / GiB

    return {
        "kv_tokens": one(
            "kv_tokens", [p.kv_tokens for p in hist.points], float, "KV capacity", "tokens"
        ),
        "graph_pool_bytes": one(
            "graph_pool_bytes",
            [p.graph_pool_bytes for p in hist.points],
            gib,
            "Graph-pool growth",
            "GiB",
        ),
        "estimator_error_bytes": one(
            "estimator_error_bytes",
            [p.estimator_error_bytes for p in hist.points],
            gib,
            "Usage minus budget, vLLM's estimate",
            "GiB",
            zero=True,
        ),
    }


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
        ("a", cmp.a_name, _A_COLOR, -0.2),
        ("b", cmp.b_name, _B_COLOR, 0.2),
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


_PART_COLORS = {
    "baseline_torch_bytes": "#9e9e9e",
    "weights_bytes": "#3f51b5",
    "profile_peak_activation_bytes": "#ff9800",
    "mla_context_bytes": "#ffc107",
    "outside_torch_bytes": "#795548",
    "runner_buffer_bytes": "#009688",
    "profiling_residue_bytes": "#bdbdbd",
    "margin_bytes": "#607d8b",
    "kv_cache_bytes": "#4caf50",
    "free_bytes": "#f5f5f5",
}
_STAGE_COLORS = ("#e91e63", "#9c27b0", "#f44336", "#673ab7", "#ad1457", "#d81b60")


def _part_colors(parts: Sequence[tuple[str, str, int]]) -> list[str]:
    """A colour per part: fixed per term, graph stages in turn from a red-violet family."""
    stages = iter(_STAGE_COLORS * (1 + len(parts) // len(_STAGE_COLORS)))
    return [
        next(stages) if key.startswith("stage:") else _PART_COLORS.get(key, "#cccccc")
        for key, _, _ in parts
    ]


_SPLIT_COLORS = {"non_kv_bytes": "#90a4ae", "graph_bytes": "#e91e63", "kv_cache_bytes": "#81c784"}


def _split_rows(
    splits: Sequence[BudgetSplit], top: float, left: int, scale: float, sized_by: str | None
) -> list[str]:
    """One thin bar per estimator under the whole GPU, on its scale: what it holds back besides
    the KV cache, its graph estimate and the KV cache it gives (they end at the budget), with
    the figures in a caption above it."""
    out = []
    for i, split in enumerate(splits):
        y = top + i * _SPLIT_ROW_H
        figures = " · ".join(f"{label} {fmt_gib(b)}" for _, label, b in split.parts)
        tokens = f" ({split.kv_tokens:,} tokens)" if split.kv_tokens is not None else ""
        error = split.usage_minus_budget_bytes
        after = "" if error is None else f" → usage − budget {fmt_gib(error, signed=True)} GiB"
        sized = " (sized this start)" if split.estimator == sized_by else ""
        out.append(
            f'<g class="budget-split" data-estimator="{escape(split.estimator)}">'
            f'<text x="{left}" y="{y:.1f}" font-size="11"><tspan font-weight="bold">'
            f"{escape(split.label)}{sized}:</tspan> {escape(figures)} GiB{tokens}"
            f"{escape(after)}</text>"
        )
        x = float(left)
        for key, label, nbytes in split.parts:
            w = max(nbytes, 0) * scale
            out.append(
                f'<rect class="budget-part" x="{x:.2f}" y="{y + 5:.1f}" width="{w:.2f}" '
                f'height="{_SPLIT_BAR_H}" fill="{_SPLIT_COLORS[key]}" stroke="#fff" '
                f'stroke-width="0.5" data-split="{escape(key)}" data-bytes="{nbytes}">'
                f"<title>{escape(split.label)}: {escape(label)} {fmt_gib(nbytes)} GiB</title></rect>"
            )
            x += w
        out.append("</g>")
    return out


_SPLIT_ROW_H, _SPLIT_BAR_H = 36, 12


def whole_gpu_svg(
    parts: Sequence[tuple[str, str, int]],
    *,
    total_bytes: int,
    budget_bytes: int | None,
    usage_bytes: int | None,
    splits: Sequence[BudgetSplit] = (),
    sized_by: str | None = None,
    title: str = "Where the whole GPU went",
) -> str:
    """One horizontal bar from 0 to the GPU's total: every part, the budget line, the usage mark;
    under it, on the same scale, one thin bar per estimator's split of the budget
    (memest.estimate.budget_splits), so vLLM's estimate stands beside memest's.

    ``parts`` is memest.estimate.gpu_parts (key, label, bytes); the legend lists every part with
    its GiB, so small parts stay readable where their slice is thin.
    """
    width, left, right, bar_y, bar_h = 1100, 20, 20, 52, 46
    plot_w = width - left - right
    split_top = bar_y + bar_h + 46
    legend_top = split_top + len(splits) * _SPLIT_ROW_H + (14 if splits else -6)
    rows = (len(parts) + 2) // 3
    height = legend_top + rows * 20 + 10
    scale = plot_w / max(total_bytes, 1)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="memest-plot whole-gpu" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="20" font-size="14" font-weight="bold">{escape(title)} · '
        f"{fmt_gib(total_bytes)} GiB</text>",
    ]
    x = float(left)
    colors = _part_colors(parts)
    for (key, label, nbytes), color in zip(parts, colors, strict=True):
        w = nbytes * scale
        out.append(
            f'<rect class="gpu-part" x="{x:.2f}" y="{bar_y}" width="{w:.2f}" height="{bar_h}" '
            f'fill="{color}" stroke="#fff" stroke-width="0.5" data-part="{escape(key)}" '
            f'data-bytes="{nbytes}"><title>{escape(label)}: {fmt_gib(nbytes)} GiB</title></rect>'
        )
        x += w
    out += _split_rows(splits, split_top, left, scale, sized_by)
    out += _marks(budget_bytes, usage_bytes, left, scale, bar_y, bar_h)
    for i, ((_, label, nbytes), color) in enumerate(zip(parts, colors, strict=True)):
        lx = left + (i % 3) * (plot_w / 3)
        ly = legend_top + (i // 3) * 20
        out.append(
            f'<rect x="{lx:.1f}" y="{ly - 10}" width="12" height="12" fill="{color}" '
            f'stroke="#999" stroke-width="0.5"/>'
            f'<text x="{lx + 18:.1f}" y="{ly}">{escape(label)} · {fmt_gib(nbytes)} GiB</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _marks(
    budget_bytes: int | None,
    usage_bytes: int | None,
    left: int,
    scale: float,
    bar_y: int,
    bar_h: int,
) -> list[str]:
    """The budget line and the usage mark."""
    out = []
    for mark, value, dash in (("budget", budget_bytes, ""), ("usage", usage_bytes, "4 3")):
        if value is None:
            continue
        mx = left + value * scale
        out.append(
            f'<line class="gpu-{mark}" x1="{mx:.1f}" x2="{mx:.1f}" y1="{bar_y - 10}" '
            f'y2="{bar_y + bar_h + 10}" stroke="#000" stroke-width="2" stroke-dasharray="{dash}" '
            f'data-bytes="{value}"/>'
            f'<text x="{mx:.1f}" y="{bar_y - 14 if mark == "budget" else bar_y + bar_h + 24}" '
            f'text-anchor="middle">{mark} {fmt_gib(value)}</text>'
        )
    return out

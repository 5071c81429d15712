"""Plots without network or JavaScript: hand-written SVG (dashboard and reports) and, when
matplotlib is installed, PNG of the same figures.

Every drawn value carries ``data-*`` attributes with its exact bytes, so a page's numbers can be
checked against the API.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path

from memest.analysis.stages import StageBar
from memest.reporters.views import Comparison, History
from memest.units import GiB, fmt_gib

_PALETTE = {
    "indexer_logits_fp32": "#c0392b",
    "indexer_logits_bf16": "#e67e22",
    "aux_hidden_states": "#8e44ad",
    "draft_logits": "#16a085",
    "attn_output": "#2980b9",
    "qnorm_rope_kv_insert": "#27ae60",
    "moe_workspace": "#d35400",
    "gemm_workspace": "#2c3e50",
    "kv_cache": "#7f8c8d",
    "weights": "#34495e",
}
_FALLBACK = ["#1abc9c", "#3498db", "#9b59b6", "#f1c40f", "#e74c3c", "#95a5a6", "#f39c12"]
#: Unattributed owners are shades of grey, so that named owners stand out.
_GREYS = ["#bdc3c7", "#a6acaf", "#d5d8dc", "#909497", "#ccd1d1", "#b3b6b7"]
_A_COLOR = "#7f8c8d"
_B_COLOR = "#2471a3"
_BAD = "#c0392b"


def owner_color(owner: str) -> str:
    """A fixed colour per owner: known owners get theirs, unattributed ones grey shades."""
    if owner in _PALETTE:
        return _PALETTE[owner]
    digest = int(hashlib.sha256(owner.encode()).hexdigest()[:8], 16)
    if owner.startswith("unattributed"):
        return _GREYS[digest % len(_GREYS)]
    return _FALLBACK[digest % len(_FALLBACK)]


def _short(label: str, limit: int = 34) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    for step in (
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2,
        2.5,
        5,
        10,
        20,
        25,
        50,
        100,
        200,
        500,
        1000,
    ):
        if value <= step * 4:
            return step * 4
    return value * 1.1


def _gib_frame(
    title: str,
    width: int,
    height: int,
    left: int,
    top: int,
    plot_w: int,
    plot_h: int,
    max_gib: float,
) -> list[str]:
    """The opening of a GiB bar chart: the svg element, its title and five grid lines to max_gib."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="memest-plot" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="20" font-size="13" font-weight="bold">{escape(title)} (GiB)</text>',
    ]
    for i in range(5):
        v = max_gib * i / 4
        y = top + plot_h - plot_h * i / 4
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>'
        )
    return out


def stage_owner_svg(bars: Sequence[StageBar], title: str = "Added graph-pool memory") -> str:
    """Stacked bars: one per capture stage, one segment per owner, heights in GiB."""
    width, height = 620, 330
    left, right, top, bottom = 50, 215, 36, 66
    plot_w, plot_h = width - left - right, height - top - bottom
    max_gib = _nice_max(max((b.pool_growth_bytes / GiB for b in bars), default=0))
    out = _gib_frame(title, width, height, left, top, plot_w, plot_h, max_gib)
    n = max(len(bars), 1)
    slot = plot_w / n
    bar_w = min(60.0, slot * 0.6)
    owners_seen: list[str] = []
    for i, bar in enumerate(bars):
        x = left + slot * i + (slot - bar_w) / 2
        y: float = top + plot_h
        out.append(
            f'<g class="stage-bar" data-stage="{escape(bar.stage)}" '
            f'data-bytes="{bar.pool_growth_bytes}">'
        )
        for seg in bar.owners:
            h = plot_h * (seg.bytes / GiB) / max_gib
            y -= h
            if seg.owner not in owners_seen:
                owners_seen.append(seg.owner)
            out.append(
                f'<rect class="owner-seg" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                f'height="{max(h, 0):.1f}" fill="{owner_color(seg.owner)}" '
                f'data-owner="{escape(seg.owner)}" data-bytes="{seg.bytes}">'
                f"<title>{escape(bar.stage)} · {escape(seg.owner)}: {fmt_gib(seg.bytes)} GiB"
                "</title></rect>"
            )
        top_y = top + plot_h - plot_h * (bar.pool_growth_bytes / GiB) / max_gib
        out.append(
            f'<text class="bar-total" x="{x + bar_w / 2:.1f}" y="{min(top_y, y) - 4:.1f}" '
            f'text-anchor="middle">{fmt_gib(bar.pool_growth_bytes)}</text>'
        )
        label = bar.stage
        out.append(
            f'<text x="{x + bar_w / 2:.1f}" y="{top + plot_h + 14}" text-anchor="end" '
            f'transform="rotate(-25 {x + bar_w / 2:.1f} {top + plot_h + 14})">{escape(label)}</text>'
        )
        out.append("</g>")
    out.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" '
        'stroke="#333"/>'
    )
    lx, ly = left + plot_w + 16, top
    for j, owner in enumerate(owners_seen[:16]):
        yy = ly + j * 16
        out.append(
            f'<rect x="{lx}" y="{yy}" width="10" height="10" fill="{owner_color(owner)}"/>'
            f'<text x="{lx + 14}" y="{yy + 9}">{escape(_short(owner))}'
            f"<title>{escape(owner)}</title></text>"
        )
    out.append("</svg>")
    return "".join(out)


def compare_svg(cmp: Comparison, title: str = "Graph-pool growth per stage") -> str:
    """Paired bars per stage: build A beside build B (GiB)."""
    rows = [d for d in cmp.stages if d.key != "total"]
    width, height = 640, 320
    left, right, top, bottom = 60, 120, 36, 70
    plot_w, plot_h = width - left - right, height - top - bottom
    max_gib = _nice_max(max(((max(d.a or 0, d.b or 0)) / GiB for d in rows), default=0))
    out = _gib_frame(title, width, height, left, top, plot_w, plot_h, max_gib)
    slot = plot_w / max(len(rows), 1)
    bw = min(28.0, slot * 0.35)
    for i, d in enumerate(rows):
        cx = left + slot * i + slot / 2
        for side, val, color, dx in (("a", d.a, _A_COLOR, -bw), ("b", d.b, _B_COLOR, 0.0)):
            if val is None:
                continue
            h = plot_h * (val / GiB) / max_gib
            y = top + plot_h - h
            out.append(
                f'<rect class="cmp-bar" x="{cx + dx:.1f}" y="{y:.1f}" width="{bw:.1f}" '
                f'height="{h:.1f}" fill="{color}" data-stage="{escape(d.key)}" data-side="{side}" '
                f'data-bytes="{val}"><title>{escape(d.key)} {side.upper()}: {fmt_gib(val)} GiB'
                f"</title></rect>"
                f'<text x="{cx + dx + bw / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                f'font-size="9">{fmt_gib(val, 2)}</text>'
            )
        out.append(
            f'<text x="{cx:.1f}" y="{top + plot_h + 14}" text-anchor="end" '
            f'transform="rotate(-25 {cx:.1f} {top + plot_h + 14})">{escape(d.key)}</text>'
        )
    out.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" '
        'stroke="#333"/>'
    )
    lx = left + plot_w + 16
    for j, (name, color) in enumerate(((cmp.a.build, _A_COLOR), (cmp.b.build, _B_COLOR))):
        out.append(
            f'<rect x="{lx}" y="{top + j * 16}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{top + j * 16 + 9}">{escape(name or "?")}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _tick(v: float) -> str:
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.2f}M"
    if a >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:.2f}"


def series_svg(
    labels: Sequence[str],
    values: Sequence[float | None],
    bad: Sequence[bool],
    *,
    title: str,
    unit: str,
    metric: str,
    raw: Sequence[int | None],
) -> str:
    """One history series: a line over builds; regressed builds are red rings."""
    width, height = 400, 240
    left, right, top, bottom = 64, 16, 32, 70
    plot_w, plot_h = width - left - right, height - top - bottom
    present = [v for v in values if v is not None]
    lo = min(min(present, default=0.0), 0.0)
    hi = max(present, default=1.0)
    if hi <= lo:
        hi = lo + 1.0
    span = hi - lo
    hi += span * 0.1
    lo -= span * 0.1 if lo < 0 else 0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="memest-plot" role="img" '
        f'data-metric="{escape(metric)}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">'
        f"{escape(title)} ({escape(unit)})</text>",
    ]

    def ypos(v: float) -> float:
        return top + plot_h - plot_h * (v - lo) / (hi - lo)

    for i in range(5):
        v = lo + (hi - lo) * i / 4
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{ypos(v):.1f}" y2="{ypos(v):.1f}" '
            f'stroke="#e5e5e5"/><text x="{left - 6}" y="{ypos(v) + 4:.1f}" text-anchor="end">'
            f"{_tick(v)}</text>"
        )
    if lo < 0 < hi:
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{ypos(0):.1f}" y2="{ypos(0):.1f}" '
            'stroke="#999" stroke-dasharray="3 3"/>'
        )
    n = len(labels)
    xs = [left + (plot_w * (i + 0.5) / n if n else 0) for i in range(n)]
    pts = [(x, ypos(v)) for x, v in zip(xs, values, strict=True) if v is not None]
    if len(pts) > 1:
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{_B_COLOR}" stroke-width="2"/>')
    last_label = -1e9
    for i, (x, val) in enumerate(zip(xs, values, strict=True)):
        if x - last_label >= 28:  # skip labels that would overlap their neighbour
            last_label = x
            ly = top + plot_h + 12
            out.append(
                f'<text x="{x:.1f}" y="{ly}" text-anchor="end" font-size="10" '
                f'transform="rotate(-35 {x:.1f} {ly})">{escape(labels[i][:16])}</text>'
            )
        if val is None:
            continue
        color = _BAD if bad[i] else _B_COLOR
        r = 6 if bad[i] else 4
        out.append(
            f'<circle class="point{" regression" if bad[i] else ""}" cx="{x:.1f}" '
            f'cy="{ypos(val):.1f}" r="{r}" fill="{color}" data-value="{raw[i]}">'
            f"<title>{escape(labels[i])}: {val:,.3f}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out)


def history_svgs(hist: History) -> dict[str, str]:
    """The history page's three series: KV tokens, graph-pool GiB, estimator error GiB."""
    labels = [p.build or p.run_id[:10] for p in hist.points]

    def one(
        metric: str, raw: list[int | None], to_unit: Callable[[int], float], title: str, unit: str
    ) -> str:
        return series_svg(
            labels,
            [to_unit(v) if v is not None else None for v in raw],
            [metric in p.regressions for p in hist.points],
            title=title,
            unit=unit,
            metric=metric,
            raw=raw,
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
            "Usage minus budget (vLLM estimate)",
            "GiB",
        ),
    }


def save_png_stage_owner(bars: Sequence[StageBar], path: Path, title: str) -> Path:
    """The stacked stage x owner bars as a PNG (matplotlib, Agg backend).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    seen: set[str] = set()
    for i, bar in enumerate(bars):
        bottom = 0.0
        for seg in bar.owners:
            h = seg.bytes / GiB
            ax.bar(
                i,
                h,
                bottom=bottom,
                color=owner_color(seg.owner),
                label=None if seg.owner in seen else seg.owner,
            )
            seen.add(seg.owner)
            bottom += h
        ax.text(i, bottom, fmt_gib(bar.pool_growth_bytes), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(bars)), [b.stage for b in bars], rotation=20, ha="right")
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = range(len(rows))
    ax.bar(
        [x - 0.2 for x in xs],
        [(d.a or 0) / GiB for d in rows],
        0.4,
        label=cmp.a.build,
        color=_A_COLOR,
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [(d.b or 0) / GiB for d in rows],
        0.4,
        label=cmp.b.build,
        color=_B_COLOR,
    )
    ax.set_xticks(list(xs), [d.key for d in rows], rotation=20, ha="right")
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_PART_COLORS = {
    "baseline_torch_bytes": "#9e9e9e",
    "weights_bytes": "#3f51b5",
    "profile_peak_activation_bytes": "#ff9800",
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


def whole_gpu_svg(
    parts: Sequence[tuple[str, str, int]],
    *,
    total_bytes: int,
    budget_bytes: int | None,
    usage_bytes: int | None,
    title: str = "Where the whole GPU went",
) -> str:
    """One horizontal bar from 0 to the GPU's total: every part, the budget line, the usage mark.

    ``parts`` is memest.estimate.gpu_parts (key, label, bytes); the legend lists every part with
    its GiB, so small parts stay readable where their slice is thin.
    """
    width, left, right, bar_y, bar_h = 1100, 20, 20, 52, 46
    plot_w = width - left - right
    legend_top = bar_y + bar_h + 40
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

"""The whole GPU as one SVG bar: each full-initialization term, each graph stage, the KV cache
and what is left, with each estimator's split of the budget under it."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from memest.estimate import BudgetSplit
from memest.units import fmt_gib

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

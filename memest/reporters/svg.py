"""What every hand-written SVG plot shares: the opening tag, axis ticks, short labels, colours."""

from __future__ import annotations

import math
from html import escape

A_COLOR = "#9e9e9e"
B_COLOR = "#2471a3"
BAD_COLOR = "#c0392b"


def short_label(label: str, limit: int = 34) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def nice_max(value: float) -> float:
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


def svg_open(width: int, height: int, title: str, cls: str = "", **data: str) -> list[str]:
    attrs = "".join(f' data-{k}="{escape(v)}"' for k, v in data.items())
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="memest-plot {cls}" role="img"{attrs} '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
    ]

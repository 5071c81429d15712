"""A model's history as SVG: one small chart per tracked figure, a colour per configuration,
regressions marked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from memest.builds.history import History
from memest.reporters.svg import BAD_COLOR, nice_ticks, short_label, svg_open, tick_text
from memest.units import GiB

#: Series colours (none red: red marks a regression), and the marker shapes that, with them,
#: give each configuration of a model's history its own look: 8 x 4 configurations.
SERIES_COLORS = (
    "#2471a3",
    "#e67e22",
    "#27ae60",
    "#8e44ad",
    "#16a085",
    "#8d6e63",
    "#7b8a8b",
    "#b7950b",
)
MARKERS = ("circle", "square", "triangle", "diamond")
DISTINCT_SERIES = len(SERIES_COLORS) * len(MARKERS)
#: Past DISTINCT_SERIES, the rest share one look (named "other configurations" on the page).
OTHER_COLOR, OTHER_MARKER = "#bbbbbb", "cross"


def series_color(index: int) -> str:
    """The colour of history series ``index`` (a configuration fingerprint)."""
    return SERIES_COLORS[index % len(SERIES_COLORS)] if index < DISTINCT_SERIES else OTHER_COLOR


def series_marker(index: int) -> str:
    """The marker shape of history series ``index``: the colours cycle once per shape."""
    return MARKERS[index // len(SERIES_COLORS)] if index < DISTINCT_SERIES else OTHER_MARKER


def marker_svg(shape: str, x: float, y: float, r: float, attrs: str) -> str:
    """One marker centred on (x, y) with half-size ``r``; ``attrs`` are its fill and stroke."""
    if shape == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {attrs}'
    if shape in ("triangle", "diamond"):
        pts = (
            [(x, y - r * 1.2), (x + r * 1.1, y + r * 0.9), (x - r * 1.1, y + r * 0.9)]
            if shape == "triangle"
            else [(x, y - r * 1.3), (x + r * 1.1, y), (x, y + r * 1.3), (x - r * 1.1, y)]
        )
        text = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        return f'<polygon points="{text}" {attrs}'
    if shape == "cross":
        return (
            f'<path d="M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x - r:.1f},{y + r:.1f}'
            f'L{x + r:.1f},{y - r:.1f}" stroke-width="2" {attrs.replace("fill=", "stroke=", 1)}'
        )
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {attrs}'


def series_key(index: int) -> str:
    """A legend swatch of series ``index``: its line colour and marker (inline SVG)."""
    color = series_color(index)
    mark = marker_svg(series_marker(index), 11, 6, 4, f'fill="{color}"')
    return (
        '<svg class="series-key" width="22" height="12" aria-hidden="true">'
        f'<line x1="0" x2="22" y1="6" y2="6" stroke="{color}" stroke-width="2"/>{mark}/></svg>'
    )


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
    lines: Sequence[object] = (),
) -> str:
    """A history metric: one colour per configuration (``series``); regressions are red rings.

    A line joins the points of one ``lines`` key (default: the series): the history passes
    configuration and KV sizing, so an apply start is never joined to a vLLM-sized one (the
    history never compares them).

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
    out = svg_open(width, height, title, "history", metric=metric)
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
    keys = list(lines) if lines else list(groups)
    for key in dict.fromkeys(keys):
        members = [i for i, k in enumerate(keys) if k == key and values[i] is not None]
        pts = [f"{xs[i]:.1f},{axis.y(values[i] or 0.0):.1f}" for i in members]
        if len(pts) > 1:
            out.append(
                f'<polyline points="{" ".join(pts)}" fill="none" '
                f'stroke="{series_color(groups[members[0]])}" stroke-width="2"/>'
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
                f'transform="rotate(-40 {x:.1f} {ly:.1f})">{escape(short_label(labels[i], 20))}'
                f"<title>{escape(titles[i])}</title></text>"
            )
        if val is None:
            continue
        color = series_color(groups[i])
        ring = f' stroke="{BAD_COLOR}" stroke-width="3"' if bad[i] else ""
        attrs = (
            f'class="point{" regression" if bad[i] else ""}" fill="{color}"{ring} '
            f'data-value="{raw[i]}"'
        )
        mark = marker_svg(series_marker(groups[i]), x, axis.y(val), 6 if bad[i] else 4, attrs)
        out.append(f"{mark}><title>{escape(titles[i])}: {val:,.3f}</title></{_tag(mark)}>")
    return out


def _tag(element: str) -> str:
    """The tag name of an opened SVG element (``<rect x=...`` -> ``rect``)."""
    return element[1:].split(" ", 1)[0]


def history_labels(hist: History) -> list[str]:
    """x labels: the build when every run has its own and it is short, else the run's number on
    the page (#1 oldest; the history table numbers its rows the same way). Each point's run id
    is its tooltip."""
    builds = [p.build for p in hist.points]
    if all(builds) and len(set(builds)) == len(builds) and max(map(len, builds)) <= 16:
        return builds
    return [f"#{i}" for i in range(1, len(hist.points) + 1)]


def history_svgs(hist: History) -> dict[str, str]:
    """The history page's three series: KV tokens, graph-pool GiB, and each start's own usage
    minus budget in GiB (the run page's card: what the start used, whoever sized its KV)."""
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
            lines=[(p.series, p.kv_sized_by) for p in hist.points],
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
        "usage_minus_budget_bytes": one(
            "usage_minus_budget_bytes",
            [p.usage_minus_budget_bytes for p in hist.points],
            gib,
            "Usage minus budget, this start",
            "GiB",
            zero=True,
        ),
    }


def config_legends(hist: History) -> tuple[list[str], list[str]]:
    """What every configuration of the history shares, and per configuration (in series order)
    only what sets it apart: a legend of whole summaries reads the same on every row. Where two
    configurations read alike, the fields that tell them apart are added."""
    parts = [c.summary.split(" · ") for c in hist.configs]
    shared = [p for p in parts[0] if all(p in other for other in parts)] if parts else []
    own = [" · ".join(p for p in mine if p not in shared) or "(same fields)" for mine in parts]
    for text in {t for t in own if own.count(t) > 1}:
        alike = [i for i, t in enumerate(own) if t == text]
        for i in alike:
            own[i] = f"{text} · {_telling_apart(hist, alike, i)}"
    return shared, own


def _telling_apart(hist: History, alike: list[int], i: int) -> str:
    """Fields that tell configuration ``i`` from each other one of ``alike``: for each, the
    first field in which they differ, unless a field already named tells them apart."""
    mine = hist.configs[i].fields
    names: list[str] = []
    for j in alike:
        theirs = hist.configs[j].fields
        if j == i or any(_differ(theirs.get(n), mine[n]) for n in names):
            continue
        differing = [n for n in mine if n != "model" and _differ(theirs.get(n), mine[n])]
        if not differing:
            return "recorded differently"
        names.append(differing[0])
    return ", ".join(f"{name} {_field_words(mine[name])}" for name in names)


def _differ(a: str | None, b: str) -> bool:
    return a is None or _field_words(a) != _field_words(b)


def _field_words(value: str) -> str:
    """A configuration field's value in a legend: a recorded mapping as "recorded"."""
    if value == "None":
        return "not recorded"
    return "recorded" if value.startswith("{") else value

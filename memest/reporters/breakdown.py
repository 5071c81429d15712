"""Render a Breakdown as the seed's tables (markdown or aligned text).

Tables: added GPU memory per phase, graph counts and pool growth per capture stage, the trigger
table per stage ("Allocation that triggers new reserved space"), live peaks, retained
allocations and unattributed bytes by top frame.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from memest.analysis.replay import NO_STAGE
from memest.schema.breakdown import Breakdown, StageGrowth
from memest.units import GiB, MiB

_UNITS = {"GiB": (GiB, 3), "MiB": (MiB, 1)}


class _Fmt:
    def __init__(self, unit: str) -> None:
        if unit not in _UNITS:
            raise ValueError(f"unit must be one of {sorted(_UNITS)}")
        self.unit = unit
        self.div, self.digits = _UNITS[unit]

    def __call__(self, n_bytes: int) -> str:
        return f"{n_bytes / self.div:.{self.digits}f}"


def _stage_label(phase: str, stage: str) -> str:
    return f"{stage} [{phase}]" if phase and phase != "capture" else stage


def tables(bd: Breakdown, unit: str = "GiB") -> list[tuple[str, list[str], list[list[str]]]]:
    """The breakdown as (title, header, rows) tables, in the seed's order."""
    f = _Fmt(unit)
    u = f.unit
    out: list[tuple[str, list[str], list[list[str]]]] = []
    if bd.phases:
        header = [f"Actual added GPU memory ({u})", *[p.phase for p in bd.phases]]
        rows = [
            ["Total", *[f(p.total_added_bytes) for p in bd.phases]],
            ["CUDA graph pools", *[f(p.graph_pool_bytes) for p in bd.phases]],
            [
                "Other PyTorch buffers and cached memory",
                *[f(p.other_torch_bytes) for p in bd.phases],
            ],
            [
                "CUDA / library allocations outside PyTorch",
                *[f(p.outside_torch_bytes) for p in bd.phases],
            ],
        ]
        out.append(("Added GPU memory per phase", header, rows))
    # Eager phases have no capture stage; their growth is already in the phase table.
    staged = [s for s in bd.stages if s.stage != NO_STAGE or s.pool_growth_bytes]
    if staged:
        header = [
            "Capture stage",
            "Widest",
            "CUDA graphs captured",
            f"Added pool memory ({u})",
            f"Warm-up / eager growth ({u})",
        ]
        rows = []
        by_phase: dict[str, list[StageGrowth]] = defaultdict(list)
        for s in staged:
            by_phase[s.phase].append(s)
        for phase, group in by_phase.items():
            rows += [
                [
                    _stage_label(s.phase, s.stage),
                    s.widest or "",
                    "" if s.graph_count is None else str(s.graph_count),
                    f(s.pool_growth_bytes),
                    f(s.default_pool_growth_bytes),
                ]
                for s in group
            ]
            counted = [s.graph_count for s in group if s.graph_count is not None]
            rows.append(
                [
                    _stage_label(phase, "Total graph pool"),
                    "",
                    str(sum(counted)) if counted else "",
                    f(sum(s.pool_growth_bytes for s in group)),
                    f(sum(s.default_pool_growth_bytes for s in group)),
                ]
            )
        out.append(("Measured graph counts and capture-stage memory", header, rows))
    by_stage: dict[tuple[str, str], list[list[str]]] = defaultdict(list)
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for t in bd.triggers:
        by_stage[(t.phase, t.stage)].append(
            [t.owner, f(t.bytes), str(t.count), f(t.requested_bytes), t.top_frame or ""]
        )
        totals[(t.phase, t.stage)] += t.bytes
    for key, rows in by_stage.items():
        label = _stage_label(*key)
        rows.append([f"Total {label} pool increment", f(totals[key]), "", "", ""])
        out.append(
            (
                f"{label}: allocation that triggers new reserved space",
                ["Owner", f"Added reserved {u}", "Segments", f"Requested {u}", "Frame"],
                rows,
            )
        )
    if bd.live_peaks:
        rows = [
            [_stage_label(p.phase, p.stage), p.owner, f(p.peak_bytes)]
            for p in bd.live_peaks
            if p.stage != "(none)" or not p.owner.startswith("unattr")
        ]
        out.append(
            ("Live-tensor peak per stage and owner", ["Stage", "Owner", f"Live peak {u}"], rows)
        )
    if bd.retained:
        rows = [
            [
                _stage_label(r.phase, r.stage),
                r.owner,
                "" if r.capture_size is None else str(r.capture_size),
                f(r.bytes),
                str(r.count),
            ]
            for r in bd.retained
        ]
        per_owner: dict[str, int] = defaultdict(int)
        for r in bd.retained:
            per_owner[r.owner] += r.bytes
        rows += [["Total", owner, "", f(n), ""] for owner, n in sorted(per_owner.items())]
        out.append(
            (
                "Retained: allocated in a capture stage, still live at the end",
                ["Stage", "Owner", "Capture size", f"Retained {u}", "Tensors"],
                rows,
            )
        )
    if bd.unattributed:
        rows = [
            [_stage_label(r.phase, r.stage), r.view, r.top_frame, f(r.bytes), str(r.count)]
            for r in bd.unattributed
        ]
        out.append(
            ("Unattributed bytes by top frame", ["Stage", "View", "Top frame", u, "Count"], rows)
        )
    if bd.pools:
        rows = [
            [
                p.pool,
                "graph (private)" if p.private else "default",
                f(p.growth_bytes),
                f(p.released_bytes),
                "" if p.reserved_end_bytes is None else f(p.reserved_end_bytes),
            ]
            for p in bd.pools
        ]
        out.append(
            (
                "Allocator pools: replayed segment events and the final snapshot",
                ["Pool", "Kind", f"Grown {u}", f"Released {u}", f"Reserved at snapshot {u}"],
                rows,
            )
        )
    return out


def render_markdown(bd: Breakdown, unit: str = "GiB") -> str:
    """Markdown tables (the seed's layout)."""
    parts: list[str] = []
    for title, header, rows in tables(bd, unit):
        parts.append(f"### {title}\n")
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "|".join("---" for _ in header) + "|")
        parts += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        parts.append("")
    parts += _footer(bd)
    return "\n".join(parts) + "\n"


def _align(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *[line(r) for r in rows]]


def render_text(bd: Breakdown, unit: str = "GiB") -> str:
    """Aligned plain-text tables for a terminal."""
    parts: list[str] = []
    for title, header, rows in tables(bd, unit):
        parts += [title, *_align(header, rows), ""]
    parts += _footer(bd)
    return "\n".join(parts) + "\n"


def _footer(bd: Breakdown) -> list[str]:
    lines = [f"{bd.event_count} allocator events."]
    lines += [f"warning: {w}" for w in bd.warnings]
    return lines

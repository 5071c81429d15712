"""Render a Breakdown as the seed's tables (markdown or aligned text).

Tables: added GPU memory per phase, graph counts and pool growth per capture stage, the trigger
table per stage ("Allocation that triggers new reserved space"), live peaks, retained
allocations and unattributed bytes by top frame.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from memest.analysis.replay import NO_STAGE
from memest.reporters.table import Table, markdown_lines, text_lines
from memest.reporters.views import NEGATIVE_NOTE, NESTED_NOTE, phase_rows
from memest.schema.breakdown import Breakdown, PhaseRecord, StageGrowth
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


def _phase_table(bd: Breakdown, f: _Fmt, phases: Sequence[PhaseRecord]) -> Table:
    """Added memory per phase, one column per phase: a phase that runs inside another follows
    it, marked ↳ (its bytes are in that phase too); a negative category is marked †."""
    rows_ = phase_rows(bd.phases, phases)
    negative = False

    def cell(v: int) -> str:
        nonlocal negative
        negative = negative or v < 0
        return f(v) + (" †" if v < 0 else "")

    header = [f"Actual added GPU memory ({f.unit})"]
    header += [f"↳ {r.split.phase} (in {r.parent})" if r.parent else r.split.phase for r in rows_]
    splits = [r.split for r in rows_]
    rows = [
        ["Total", *[cell(p.total_added_bytes) for p in splits]],
        ["CUDA graph pools", *[cell(p.graph_pool_bytes) for p in splits]],
        ["Other PyTorch buffers and cached memory", *[cell(p.other_torch_bytes) for p in splits]],
        [
            "CUDA / library allocations outside PyTorch",
            *[cell(p.outside_torch_bytes) for p in splits],
        ],
    ]
    notes = []
    if any(r.parent for r in rows_):
        notes.append(f"{NESTED_NOTE}.")
    if negative:
        notes.append(f"† {NEGATIVE_NOTE}.")
    return Table("Added GPU memory per phase", header, rows, notes)


#: Why a PIECEWISE stage's count in a snapshot is larger than the capture plan's.
PIECEWISE_COUNT_NOTE = (
    "(per piece): a PIECEWISE stage captures one CUDA graph per piece of the split model for "
    "each size, so the allocator counts sizes × pieces where the capture plan counts sizes"
)


def _stage_table(staged: Sequence[StageGrowth], f: _Fmt) -> Table:
    """Graph counts and pool growth per capture stage (a Widest column only when known)."""
    u = f.unit
    widest = any(s.widest for s in staged)
    header = ["Capture stage", *(["Widest"] if widest else [])]
    header += ["CUDA graphs captured", f"Added pool memory ({u})", f"Warm-up / eager growth ({u})"]
    rows = []
    by_phase: dict[str, list[StageGrowth]] = defaultdict(list)
    for s in staged:
        by_phase[s.phase].append(s)
    for phase, group in by_phase.items():
        for s in group:
            count = "" if s.graph_count is None else str(s.graph_count)
            if count and s.stage.endswith(".piecewise"):
                count += " (per piece)"
            rows.append(
                [_stage_label(s.phase, s.stage), *([s.widest or ""] if widest else [])]
                + [count, f(s.pool_growth_bytes), f(s.default_pool_growth_bytes)]
            )
        counted = [s.graph_count for s in group if s.graph_count is not None]
        piecewise = any(s.graph_count and s.stage.endswith(".piecewise") for s in group)
        rows.append(
            [_stage_label(phase, "Total graph pool"), *([""] if widest else [])]
            + [
                f"{sum(counted)}{' (pieces counted)' if piecewise else ''}" if counted else "",
                f(sum(s.pool_growth_bytes for s in group)),
                f(sum(s.default_pool_growth_bytes for s in group)),
            ]
        )
    notes = []
    if any(s.graph_count and s.stage.endswith(".piecewise") for s in staged):
        notes.append(f"{PIECEWISE_COUNT_NOTE}.")
    return Table("Measured graph counts and capture-stage memory", header, rows, notes)


def tables(bd: Breakdown, unit: str = "GiB", phases: Sequence[PhaseRecord] = ()) -> list[Table]:
    """The breakdown as tables, in the seed's order.

    ``phases`` (the phase records with their windows) nests the phase table.
    """
    f = _Fmt(unit)
    u = f.unit
    out: list[Table] = []
    if bd.phases:
        out.append(_phase_table(bd, f, phases))
    # Eager phases have no capture stage; their growth is already in the phase table.
    staged = [s for s in bd.stages if s.stage != NO_STAGE or s.pool_growth_bytes]
    if staged:
        out.append(_stage_table(staged, f))
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
            Table(
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
            Table(
                "Live-tensor peak per stage and owner", ["Stage", "Owner", f"Live peak {u}"], rows
            )
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
            Table(
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
            Table(
                "Unattributed bytes by top frame",
                ["Stage", "View", "Top frame", u, "Count"],
                rows,
            )
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
            Table(
                "Allocator pools: replayed segment events and the final snapshot",
                ["Pool", "Kind", f"Grown {u}", f"Released {u}", f"Reserved at snapshot {u}"],
                rows,
            )
        )
    return out


def render_markdown(bd: Breakdown, unit: str = "GiB", phases: Sequence[PhaseRecord] = ()) -> str:
    """Markdown tables (the seed's layout)."""
    parts = markdown_lines(tables(bd, unit, phases)) + _footer(bd)
    return "\n".join(parts) + "\n"


def render_text(bd: Breakdown, unit: str = "GiB", phases: Sequence[PhaseRecord] = ()) -> str:
    """Aligned plain-text tables for a terminal."""
    parts = text_lines(tables(bd, unit, phases)) + _footer(bd)
    return "\n".join(parts) + "\n"


def _footer(bd: Breakdown) -> list[str]:
    lines = [f"{bd.event_count} allocator events."]
    lines += [f"warning: {w}" for w in bd.warnings]
    return lines

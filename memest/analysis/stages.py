"""Pool growth per capture stage, split by owner: the stacked bars every surface draws."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol, TypeVar

from pydantic import BaseModel, Field

from memest.analysis.ranks import capture_stages
from memest.schema import RunReport
from memest.units import GiB

#: Owner shown for the part of a stage's pool growth no trigger row claims.
REMAINDER_OWNER = "unattributed:remainder"
#: Owner of the segment that sums a stage's smaller owners once a surface caps them.
OTHER_OWNER = "other"
#: Stage of the bar that sums the smaller stages once a surface caps them.
OTHER_STAGE = "other"


class _Staged(Protocol):
    """A trigger or retained row: the stage (and phase) it belongs to."""

    @property
    def stage(self) -> str: ...
    @property
    def phase(self) -> str: ...


_RowT = TypeVar("_RowT", bound=_Staged)


class OwnerSegment(BaseModel):
    """One owner's share of a stage's pool growth (one segment of a stacked bar)."""

    owner: str
    bytes: int
    note: str = ""


class StageBar(BaseModel):
    """One capture stage: its pool growth split by owner, and how many graphs it captured."""

    stage: str
    phase: str = "capture"
    pool_growth_bytes: int
    graph_count: int | None = None
    widest: str | None = None
    owners: list[OwnerSegment] = Field(default_factory=list)


def _group(rows: Iterable[_RowT]) -> dict[tuple[str, str], list[_RowT]]:
    """Rows by (stage, phase), each group in the rows' order: one pass over all rows."""
    out: dict[tuple[str, str], list[_RowT]] = defaultdict(list)
    for row in rows:
        out[(row.stage, row.phase)].append(row)
    return out


def _segments(rows: Iterable[tuple[str, int, str]]) -> dict[str, OwnerSegment]:
    """(owner, bytes, note) rows summed per owner; the first row of an owner gives its note."""
    owners: dict[str, OwnerSegment] = {}
    for owner, size, note in rows:
        seg = owners.get(owner)
        if seg is None:
            seg = owners[owner] = OwnerSegment(owner=owner, bytes=0, note=note)
        seg.bytes += size
    return owners


def _capped(segments: list[OwnerSegment], max_owners: int | None) -> list[OwnerSegment]:
    """The ``max_owners`` largest segments, the rest summed into one OTHER_OWNER segment."""
    if max_owners is None or len(segments) <= max_owners:
        return segments
    kept = segments[: max_owners - 1] if max_owners > 1 else []
    rest = segments[len(kept) :]
    other = OwnerSegment(
        owner=OTHER_OWNER, bytes=sum(s.bytes for s in rest), note=f"{len(rest)} more owners"
    )
    return [*kept, other]


def _folded(bars: list[StageBar], max_stages: int | None) -> list[StageBar]:
    """The ``max_stages - 1`` stages of most pool growth, in their order, then one OTHER_STAGE
    bar summing the rest (its owners summed across those stages)."""
    if max_stages is None or len(bars) <= max_stages:
        return bars
    by_size = sorted(range(len(bars)), key=lambda i: -bars[i].pool_growth_bytes)
    kept = set(by_size[: max_stages - 1] if max_stages > 1 else [])
    rest = [bar for i, bar in enumerate(bars) if i not in kept]
    owners = _segments((o.owner, o.bytes, o.note) for bar in rest for o in bar.owners)
    counts = [bar.graph_count for bar in rest]
    other = StageBar(
        stage=OTHER_STAGE,
        phase="capture",
        pool_growth_bytes=sum(bar.pool_growth_bytes for bar in rest),
        graph_count=None if None in counts else sum(c for c in counts if c is not None),
        widest=f"{len(rest)} more stages",
        owners=sorted(owners.values(), key=lambda o: -o.bytes),
    )
    return [*(bar for i, bar in enumerate(bars) if i in kept), other]


def stage_bars(
    report: RunReport, max_owners: int | None = None, max_stages: int | None = None
) -> list[StageBar]:
    """Pool growth per capture stage, split by the owners of the trigger rows.

    A stage without trigger rows is split by its retained rows instead. Growth no row claims becomes
    ``unattributed:remainder``; a stage with no rows at all is one segment of that owner. With
    ``max_owners``, a stage keeps its largest ``max_owners - 1`` segments and sums the rest into
    one ``other`` segment; with ``max_stages``, the ``max_stages - 1`` stages of most growth are
    kept and the rest summed into one ``other`` stage. Linear in the report's rows (plus a sort
    of the stages): triggers and retained rows are grouped by stage once, not scanned once per
    stage.
    """
    bd = report.breakdown
    if bd is None:
        return []
    triggers = _group(bd.triggers)
    retained = _group(bd.retained)
    bars: list[StageBar] = []
    for st in capture_stages(report):
        key = (st.stage, st.phase)
        owners = _segments((t.owner, t.bytes, t.note) for t in triggers.get(key, []))
        if not owners:
            # Without trigger rows, tensors retained in the stage's pool are the best-known owners.
            kept = retained.get(key, [])
            owners = _segments((r.owner, r.bytes, "retained at end of init") for r in kept)
        claimed = sum(o.bytes for o in owners.values())
        rest = st.pool_growth_bytes - claimed
        if rest > 0 and (rest > GiB // 1000 or not owners):
            owners[REMAINDER_OWNER] = OwnerSegment(owner=REMAINDER_OWNER, bytes=rest)
        segments = sorted(owners.values(), key=lambda o: -o.bytes)
        bars.append(
            StageBar(
                stage=st.stage,
                phase=st.phase,
                pool_growth_bytes=st.pool_growth_bytes,
                graph_count=st.graph_count,
                widest=st.widest,
                owners=segments,
            )
        )
    folded = _folded(bars, max_stages)
    for bar in folded:
        bar.owners = _capped(bar.owners, max_owners)
    return folded

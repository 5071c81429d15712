"""Pool growth per capture stage, split by owner: the stacked bars every surface draws."""

from __future__ import annotations

from pydantic import BaseModel, Field

from memest.analysis.ranks import capture_stages
from memest.schema import RunReport
from memest.units import GiB

#: Owner shown for the part of a stage's pool growth no trigger row claims.
REMAINDER_OWNER = "unattributed:remainder"


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


def stage_bars(report: RunReport) -> list[StageBar]:
    """Pool growth per capture stage, split by the owners of the trigger rows.

    A stage without trigger rows is split by its retained rows instead. Growth no row claims becomes
    ``unattributed:remainder``; a stage with no rows at all is one segment of that owner.
    """
    bd = report.breakdown
    if bd is None:
        return []
    bars: list[StageBar] = []
    for st in capture_stages(report):
        owners: dict[str, OwnerSegment] = {}
        for t in bd.triggers:
            if t.stage == st.stage and t.phase == st.phase:
                seg = owners.setdefault(t.owner, OwnerSegment(owner=t.owner, bytes=0, note=t.note))
                seg.bytes += t.bytes
        if not owners:
            # Without trigger rows, tensors retained in the stage's pool are the best-known owners.
            for r in bd.retained:
                if r.stage == st.stage and r.phase == st.phase:
                    seg = owners.setdefault(
                        r.owner,
                        OwnerSegment(owner=r.owner, bytes=0, note="retained at end of init"),
                    )
                    seg.bytes += r.bytes
        claimed = sum(o.bytes for o in owners.values())
        rest = st.pool_growth_bytes - claimed
        if rest > 0 and (rest > GiB // 1000 or not owners):
            owners[REMAINDER_OWNER] = OwnerSegment(owner=REMAINDER_OWNER, bytes=rest)
        bars.append(
            StageBar(
                stage=st.stage,
                phase=st.phase,
                pool_growth_bytes=st.pool_growth_bytes,
                graph_count=st.graph_count,
                widest=st.widest,
                owners=sorted(owners.values(), key=lambda o: -o.bytes),
            )
        )
    return bars

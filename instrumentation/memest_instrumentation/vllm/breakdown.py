"""The breakdown of one start at the end of init: phase split, stage rows, retained rows."""

from __future__ import annotations

from memest.analysis.phase_split import phase_split
from memest.schema import Breakdown, RetainedRow, StageGrowth
from memest_instrumentation.vllm import measure
from memest_instrumentation.vllm.state import guarded, state


def start_breakdown(end_pool_usage: dict[str, tuple[int, int]]) -> Breakdown:
    """The breakdown of this start: stage rows from pool readings at stage edges, triggers and
    the retained view from the allocator history when it was recorded."""
    st = state()
    from memest_instrumentation.vllm import recorder

    history = guarded("analysis", recorder.analyze_history)
    splits = [phase_split(p)[0] for p in st.phases if p.name != "end"]
    capture = [p for p in st.phases if p.name == "capture"]
    pool = st.figures.capture_pool
    pool_growth = 0
    stages = list(st.stages)
    if capture:
        pool_growth = max(
            measure.private_pool_bytes(capture[-1].end, pool)
            - measure.private_pool_bytes(capture[-1].start, pool),
            0,
        )
        staged = sum(s.pool_growth_bytes for s in stages if s.phase == "capture")
        if staged < pool_growth:
            stages.append(
                StageGrowth(stage="between_stages", pool_growth_bytes=pool_growth - staged)
            )
    retained: list[RetainedRow] = []
    if pool is not None and pool in end_pool_usage:
        retained.append(
            RetainedRow(
                stage="capture",
                owner="graph_pool_live_blocks",
                bytes=end_pool_usage[pool][1],
            )
        )
    if capture:
        live = capture[-1].end.torch_allocated_bytes - capture[-1].start.torch_allocated_bytes
        in_pool = end_pool_usage.get(pool or "", (0, 0))[1]
        retained.append(
            RetainedRow(
                stage="capture",
                owner="default_pool_allocated_during_capture",
                bytes=max(live - in_pool, 0),
            )
        )
    if history is not None:
        # Stage rows stay the edge readings (reservation of the capture pool at stage edges);
        # triggers, owners and the retained view come from the allocator history.
        history.phases = history.phases or splits
        for row in history.stages:
            st.notes.append(
                f"history stage row: {row.phase}/{row.stage} pool growth "
                f"{row.pool_growth_bytes} B, default-pool growth {row.default_pool_growth_bytes} B"
            )
        history.stages = stages
        history.graph_pool_growth_bytes = pool_growth
        history.retained = list(history.retained) + retained
        history.warnings.append(
            "stages: capture-pool reservation at stage edges; triggers/retained: allocator history"
        )
        return history
    return Breakdown(
        phases=splits,
        stages=stages,
        retained=retained,
        graph_pool_growth_bytes=pool_growth,
        warnings=[
            "stage growth measured by pool reservation at stage edges; no allocator history, "
            "so no trigger table or per-owner split"
        ],
    )

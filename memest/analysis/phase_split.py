"""Added device memory of each startup phase, split into graph pools, other PyTorch memory and
memory outside PyTorch (from the phase's edge readings; the replay supplies pool growth when the
readings have no per-pool figures)."""

from __future__ import annotations

from collections.abc import Sequence

from memest.schema.breakdown import PhaseRecord, PhaseSplit
from memest.snapshot.tags import DEFAULT_POOL


def _private_pool_delta(start: dict[str, int], end: dict[str, int]) -> int:
    keys = (set(start) | set(end)) - {DEFAULT_POOL}
    return sum(end.get(k, 0) - start.get(k, 0) for k in keys)


def phase_split(phase: PhaseRecord, graph_net_bytes: int = 0) -> tuple[PhaseSplit, str | None]:
    """Added device memory of one phase split into graph pools, other PyTorch and outside it.

    Graph pools come from the pool readings at the phase's edges; without them, from
    ``graph_net_bytes`` (the replayed private-pool growth). Without device readings the total
    is the allocator's reserved growth, and the second value says so.
    """
    s, e = phase.start, phase.end
    reserved = e.torch_reserved_bytes - s.torch_reserved_bytes
    warning = None
    if s.device_used_bytes is not None and e.device_used_bytes is not None:
        total = e.device_used_bytes - s.device_used_bytes
    else:
        total = reserved
        warning = f"phase {phase.name}: no device reading, total = torch reserved growth"
    if s.pool_reserved_bytes or e.pool_reserved_bytes:
        graph = _private_pool_delta(s.pool_reserved_bytes, e.pool_reserved_bytes)
    else:
        graph = graph_net_bytes
    split = PhaseSplit(
        phase=phase.name,
        total_added_bytes=total,
        graph_pool_bytes=graph,
        other_torch_bytes=reserved - graph,
        outside_torch_bytes=total - reserved,
    )
    return split, warning


def phase_splits(
    phases: Sequence[PhaseRecord], private_net: dict[str, int], warnings: list[str]
) -> list[PhaseSplit]:
    """Each phase's split (``private_net``: replayed private-pool growth per phase); the
    warnings of phases without device readings are appended to ``warnings``."""
    rows: list[PhaseSplit] = []
    for ph in phases:
        split, warning = phase_split(ph, private_net.get(ph.name, 0))
        rows.append(split)
        if warning is not None:
            warnings.append(warning)
    return rows

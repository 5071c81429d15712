"""What the lab's what-if scripts use and the product does not: a start's grid written as the
changes ``memest estimate --grid`` takes, and a whole event list replayed through the allocator
model (memest.estimate.allocsim.PoolSim) in one call.

    from whatif_tools import grid_changes, simulate   # lab scripts (lab/ is on sys.path)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from memest.estimate.allocsim import PoolSim, SimResult
from memest.schema import RunConfig


def grid_changes(config: RunConfig, *, capture_sizes: bool = False) -> dict[str, Any]:
    """A start's grid as the changes ``--grid`` takes (vLLM's flag names): overlaid on another
    start's configuration, it asks the what-if for this one. ``capture_sizes`` adds the start's
    explicit capture sizes (else G's sizing rule picks them for the new grid)."""
    spec = None
    if config.speculative_method:
        spec = {
            "method": config.speculative_method,
            "num_speculative_tokens": config.num_speculative_tokens,
        }
    changes: dict[str, Any] = {
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_model_len": config.max_model_len,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "speculative_config": spec,
    }
    if capture_sizes:
        sizes = config.cudagraph_capture_sizes
        changes["compilation_config"] = {"cudagraph_capture_sizes": sizes} if sizes else {}
    return changes


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One allocator event of the pool.

    Attributes:
        kind: "alloc" or "free".
        handle: names the allocation (the trace's address); a free names the alloc it ends.
        size: requested bytes (alloc only; a free's size is ignored).
        stream: the allocation's stream; blocks are reused only on their own stream.
        index: position in the source trace, reported with triggers.
        scales: whether :func:`simulate`'s ``scale`` applies to this request.
    """

    kind: Literal["alloc", "free"]
    handle: int
    size: int = 0
    stream: int = 0
    index: int = -1
    scales: bool = True


def simulate(events: Iterable[SimEvent], *, scale: Fraction | float = 1) -> SimResult:
    """Replay one pool's alloc / free events in order; the segments the allocator reserves.

    Args:
        events: the pool's events in trace order.
        scale: requests of events with ``scales`` set become ``ceil(size * scale)`` bytes
            (exact: a float is read as the fraction it holds).
    """
    factor = Fraction(scale)
    sim = PoolSim()
    for ev in events:
        if ev.kind == "free":
            sim.free(ev.handle)
        elif ev.scales and factor != 1:
            sim.alloc(ev.handle, max(math.ceil(ev.size * factor), 1), ev.stream, ev.index)
        else:
            sim.alloc(ev.handle, ev.size, ev.stream, ev.index)
    return sim.result()

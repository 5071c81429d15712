"""vLLM 0.33.0's own graph-memory estimate, recomputed from what its profiling pass measured.

Mirrors ``vllm/v1/worker/gpu/cudagraph_utils.py``: ``profile_cudagraph_memory`` captures every
PIECEWISE and drafter graph plus the two widest target FULL graphs into a throwaway pool, then
replaces the sampled FULL graphs by ``first + (n - 1) x max(second, 1 MiB)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from memest.errors import ConfigError
from memest.units import MiB

MIN_PER_GRAPH_BYTES = 1 * MiB


def extrapolate_full_graph_memory(samples_bytes: Sequence[int], full_graph_count: int) -> int:
    """``first + (n - 1) x max(second, 1 MiB)``; one sample gives ``first``; none gives 0."""
    if full_graph_count < 0:
        raise ConfigError("full_graph_count", full_graph_count, "must not be negative")
    if not samples_bytes or full_graph_count == 0:
        return 0
    first = samples_bytes[0]
    if len(samples_bytes) == 1:
        return first
    per_graph = max(samples_bytes[1], MIN_PER_GRAPH_BYTES)
    return first + (full_graph_count - 1) * per_graph


def vllm_cudagraph_estimate(
    measured_bytes: int, samples_bytes: Sequence[int], full_graph_count: int
) -> int:
    """vLLM's estimate: ``max(measured - sum(samples) + extrapolated, 0)``."""
    extrapolated = extrapolate_full_graph_memory(samples_bytes, full_graph_count)
    return max(measured_bytes - sum(samples_bytes) + extrapolated, 0)

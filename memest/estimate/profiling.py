"""Full-initialization terms read inside a start, around vLLM's graph-memory profiling.

In apply mode the vLLM plugin lets graph-memory profiling capture every stage into its
throwaway pool, then sizes the KV cache from these readings before vLLM allocates it. The
arithmetic lives here so that the plugin only reads and memest.estimate alone computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memest.schema import FullInitTerms, MemoryReading

#: Stage name for pool growth between the stage windows of the profiling capture.
BETWEEN_STAGES = "between_stages"


@dataclass(frozen=True)
class ProfilingReadings:
    """What the plugin read around graph-memory profiling, all after ``empty_cache``."""

    start: MemoryReading  # before the profiling capture
    end: MemoryReading  # after it, the throwaway pool still held
    now: MemoryReading  # when vLLM asks for the KV budget (pool released)
    pool_growth_bytes: int  # reservation growth of the throwaway pool over the capture
    kv_init_added_bytes: int  # allocated by initialize_kv_cache of the profiling pass
    profiling_kv_bytes: int  # the profiling pass's own KV cache
    weights_bytes: int
    activation_bytes: int  # the activation headroom (warm profile pass)
    requested_bytes: int
    margin_bytes: int = 0
    stage_pool_bytes: dict[str, int] = field(default_factory=dict)
    mla_context_bytes: int = 0  # memest.estimate.mla_context for this start's configuration
    serving_step_bytes: int = 0  # memest.estimate.sampler for this start's configuration
    before_weights: MemoryReading | None = None  # unread: the residue holds the baseline


def pool_by_stage(r: ProfilingReadings) -> tuple[int, dict[str, int]]:
    """Pool growth split by stage; growth no stage window saw becomes ``between_stages``."""
    by_stage = dict(r.stage_pool_bytes)
    staged = sum(by_stage.values())
    pool = max(r.pool_growth_bytes, 0)
    if staged > pool:
        return staged, by_stage
    if staged < pool:
        by_stage[BETWEEN_STAGES] = pool - staged
    return pool, by_stage


def capture_details(r: ProfilingReadings) -> dict[str, int]:
    """The readings behind the terms, kept in the report beside them."""
    reserved_growth = r.end.torch_reserved_bytes - r.start.torch_reserved_bytes
    used_growth = (r.end.device_used_bytes or 0) - (r.start.device_used_bytes or 0)
    return {
        "capture_default_pool_bytes": max(reserved_growth - max(r.pool_growth_bytes, 0), 0),
        "capture_outside_torch_bytes": _capture_outside(r),
        "capture_outside_torch_growth_bytes": max(used_growth - reserved_growth, 0),
        "profiling_runner_buffer_bytes": max(r.kv_init_added_bytes - r.profiling_kv_bytes, 0),
        "used_before_kv_bytes": r.now.device_used_bytes or 0,
        "serving_step_bytes": r.serving_step_bytes,
    }


def _capture_outside(r: ProfilingReadings) -> int:
    """Outside-PyTorch memory the profiling graphs hold until teardown (graph objects).

    Growth over the capture would also count lazily loaded kernels and library handles, which
    stay after teardown and are already in the device memory in use now.
    """
    outside_end = (r.end.device_used_bytes or 0) - r.end.torch_reserved_bytes
    outside_now = (r.now.device_used_bytes or 0) - r.now.torch_reserved_bytes
    return max(outside_end - outside_now, 0)


def profiling_terms(r: ProfilingReadings, *, source: str) -> FullInitTerms:
    """The full-initialization terms of a start, before its KV cache is allocated (each term's
    plugin reading: memest.estimate.terms.catalog)."""
    from memest.estimate.terms.catalog import plugin_terms

    return FullInitTerms(
        requested_bytes=r.requested_bytes,
        **plugin_terms(r),
        graph_pool_by_stage_bytes=pool_by_stage(r)[1],
        margin_bytes=r.margin_bytes,
        source=source,
    )

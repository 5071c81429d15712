"""Where startup memory went: phase readings and the stage / owner breakdown of graph pools."""

from __future__ import annotations

from typing import Literal

from memest.schema._base import Bytes, Field, MemestModel, NonNegativeBytes


class MemoryReading(MemestModel):
    """Device and allocator state at one instant (a phase edge)."""

    time_ns: int = Field(description="Monotonic clock, nanoseconds")
    device_used_bytes: NonNegativeBytes | None = Field(
        default=None, description="Device memory in use (NVML, or total - cudaMemGetInfo free)"
    )
    device_total_bytes: NonNegativeBytes | None = None
    device_source: Literal["nvml", "cudaMemGetInfo", "none"] = "none"
    torch_reserved_bytes: NonNegativeBytes = 0
    torch_allocated_bytes: NonNegativeBytes = 0
    torch_reserved_peak_bytes: NonNegativeBytes = 0
    torch_allocated_peak_bytes: NonNegativeBytes = 0
    pool_reserved_bytes: dict[str, NonNegativeBytes] = Field(
        default_factory=dict,
        description="Reserved bytes per allocator pool id, e.g. '0,0' or '0,1'",
    )
    serving_stream_free_bytes: NonNegativeBytes | None = Field(
        default=None,
        description="Free bytes the default pool holds on the CUDA stream vLLM's "
        "current_stream() names at the reading (vllm.utils.torch_utils; 0 before vLLM has made "
        "one): at the end of init the stream serving runs on, whose cache alone its first step "
        "can reuse, blocks being per stream. None when not read",
    )
    aux_stream_allocated_bytes: NonNegativeBytes | None = Field(
        default=None,
        description="Allocated bytes on vLLM's auxiliary stream (aux_stream(), where MoE shared "
        "experts run; 0 before it exists). None when not read",
    )


class PhaseRecord(MemestModel):
    name: str = Field(
        description="weights, profile_run, graph_profiling, kv_cache_alloc, capture, end"
    )
    start: MemoryReading
    end: MemoryReading


class PhaseSplit(MemestModel):
    """Added GPU memory over one phase, split as in the seed's 'Actual added GPU memory' table."""

    phase: str
    total_added_bytes: Bytes = Field(description="Device memory in use, end minus start")
    graph_pool_bytes: Bytes = Field(description="Growth of reserved bytes in private (graph) pools")
    other_torch_bytes: Bytes = Field(description="Growth of the default pool, cache included")
    outside_torch_bytes: Bytes = Field(description="total - torch reserved growth")


class StageGrowth(MemestModel):
    stage: str = Field(description="e.g. target.piecewise, target.full, draft.steps.full")
    phase: str = Field(default="capture")
    pool_growth_bytes: NonNegativeBytes
    segments: int = Field(default=0, ge=0)
    graph_count: int | None = Field(default=None, ge=0)
    widest: str | None = Field(default=None, description="Widest shape, e.g. '512 x q=8'")
    pool_released_bytes: NonNegativeBytes = Field(
        default=0, description="Private-pool segments freed or unmapped under this stage"
    )
    default_pool_growth_bytes: NonNegativeBytes = Field(
        default=0,
        description="Default-pool growth under this stage tag (eager warm-up): other PyTorch",
    )
    pools: list[str] = Field(default_factory=list, description="Private pools that grew")
    capture_sizes: list[int] = Field(default_factory=list, description="Sizes captured")


class TriggerRow(MemestModel):
    """Pool growth charged to the allocation whose request made the allocator reserve it."""

    stage: str
    owner: str
    bytes: NonNegativeBytes
    count: int = Field(default=0, ge=0)
    top_frame: str | None = None
    note: str = ""
    phase: str = Field(default="capture")
    requested_bytes: NonNegativeBytes = Field(
        default=0, description="Sum of the allocation requests that made the pool grow"
    )


class LivePeak(MemestModel):
    stage: str
    owner: str
    peak_bytes: NonNegativeBytes
    phase: str = Field(default="capture")


class RetainedRow(MemestModel):
    stage: str
    owner: str
    capture_size: int | None = None
    bytes: NonNegativeBytes
    count: int = Field(default=0, ge=0)
    phase: str = Field(default="capture")
    stream: Literal["pass", "side", "default"] | None = Field(
        default=None,
        description=(
            "The CUDA stream its allocations were made on: 'default' (stream 0), 'pass' (a "
            "stream only this phase allocated on, such as a graph-capture stream), 'side' (a "
            "stream later phases allocate on too, such as vLLM's process-wide aux stream)"
        ),
    )


class UnattributedRow(MemestModel):
    stage: str
    top_frame: str
    bytes: NonNegativeBytes
    count: int = Field(default=0, ge=0)
    phase: str = Field(default="capture")
    view: Literal["trigger", "retained"] = Field(
        default="trigger", description="Pool growth it triggered, or bytes it keeps live"
    )


class PoolRow(MemestModel):
    """One allocator pool: replayed segment events against the final snapshot's segments."""

    pool: str = Field(description="Pool id, '0,0' is the default pool")
    private: bool
    growth_bytes: NonNegativeBytes = Field(description="segment_alloc + segment_map bytes")
    released_bytes: NonNegativeBytes = Field(description="segment_free + segment_unmap bytes")
    reserved_end_bytes: NonNegativeBytes | None = Field(
        default=None, description="Segments of this pool in the final snapshot"
    )


class Breakdown(MemestModel):
    phases: list[PhaseSplit] = Field(default_factory=list)
    stages: list[StageGrowth] = Field(default_factory=list)
    triggers: list[TriggerRow] = Field(default_factory=list)
    live_peaks: list[LivePeak] = Field(default_factory=list)
    retained: list[RetainedRow] = Field(default_factory=list)
    unattributed: list[UnattributedRow] = Field(default_factory=list)
    graph_pool_growth_bytes: NonNegativeBytes = Field(
        default=0, description="Reserved growth of all private pools over the capture phases"
    )
    event_count: int = Field(default=0, ge=0)
    pools: list[PoolRow] = Field(default_factory=list)
    warnings: list[str] = Field(
        default_factory=list, description="Limits of this breakdown (lost events, missing tags)"
    )

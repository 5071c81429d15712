"""Device and allocator readings taken at phase and stage edges inside a vLLM worker.

Graph pools are measured by reservation: the allocator snapshot's segments grouped by
``segment_pool_id``, never by free-memory deltas, so an ``empty_cache()`` inside a window can
neither hide nor inflate them.
"""

from __future__ import annotations

import time
from typing import Any

from memest.schema import MemoryReading
from memest.snapshot.tags import DEFAULT_POOL
from memest_instrumentation.torch import _compat

__all__ = ["DEFAULT_POOL"]


def _torch() -> Any:
    import torch

    return torch


def cuda_ready() -> bool:
    try:
        return _compat.cuda_available() and _compat.cuda_initialized()
    except Exception:
        return False


def pool_usage() -> dict[str, tuple[int, int]]:
    """Reserved and allocated bytes per allocator pool (segments only, never the history)."""
    if not cuda_ready():
        return {}
    return _compat.pool_usage(_compat.current_device())


def vllm_streams() -> tuple[int | None, int | None]:
    """Handles of the CUDA streams vLLM 0.33.0 serves on and runs MoE shared experts on
    (``vllm.utils.torch_utils``): ``current_stream()``'s stream, or -1 before its first call
    makes one; ``aux_stream()``'s, or -1 before it exists. None for both without vLLM.

    Read without calling either function, which would make the streams.
    """
    try:
        from vllm.utils import torch_utils
    except Exception:
        return None, None
    serving = getattr(getattr(torch_utils, "_current_stream_tls", None), "value", None)
    aux = getattr(torch_utils, "_aux_stream", None)

    def handle(stream: Any) -> int:
        return int(getattr(stream, "cuda_stream", -1)) if stream is not None else -1

    return handle(serving), handle(aux)


def _stream_figures(found: list[dict[str, Any]]) -> dict[str, int]:
    """The reading's per-stream fields (MemoryReading) from the allocator's segments."""
    serving, aux = vllm_streams()
    if serving is None or aux is None:
        return {}
    return {
        "serving_stream_free_bytes": _compat.stream_usage(found, serving)[0],
        "aux_stream_allocated_bytes": _compat.stream_usage(found, aux)[1],
    }


def reading(*, pools: bool = True, sync: bool = True) -> MemoryReading:
    """One reading of the current device (zeros when CUDA is not initialised)."""
    now = time.monotonic_ns()
    if not cuda_ready():
        return MemoryReading(time_ns=now)
    torch = _torch()
    if sync:
        torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    pool_reserved: dict[str, int] = {}
    streams: dict[str, int] = {}
    if pools:
        try:
            device = _compat.current_device()
            found = _compat.segments(device)
            pool_reserved = {k: v[0] for k, v in _compat.pool_usage(device, found).items()}
            streams = _stream_figures(found)
        except RuntimeError:  # no traceless snapshot on this torch: totals only
            pool_reserved = {}
    return MemoryReading(
        time_ns=now,
        device_used_bytes=int(total - free),
        device_total_bytes=int(total),
        device_source="cudaMemGetInfo",
        torch_reserved_bytes=int(stats.get("reserved_bytes.all.current", 0)),
        torch_allocated_bytes=int(stats.get("allocated_bytes.all.current", 0)),
        torch_reserved_peak_bytes=int(stats.get("reserved_bytes.all.peak", 0)),
        torch_allocated_peak_bytes=int(stats.get("allocated_bytes.all.peak", 0)),
        pool_reserved_bytes=pool_reserved,
        **streams,
    )


def gpu_properties() -> tuple[str, int, str] | None:
    """(name, total bytes, compute capability) of the current device, None without CUDA."""
    if not cuda_ready():
        return None
    torch = _torch()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return str(props.name), int(props.total_memory), f"{props.major}.{props.minor}"


def reset_peak() -> None:
    """Start the allocator's peak statistics here (as vLLM's memory_profiling does)."""
    if cuda_ready():
        _torch().cuda.reset_peak_memory_stats()


def settle(*, collect_garbage: bool = False) -> None:
    """empty_cache (and gc when asked), so a reading holds only live and pool memory.

    gc.collect() costs up to a second in a vLLM process, so only the end-of-init reading asks
    for it; vLLM's own memory_profiling collects garbage around the profile run.
    """
    import gc

    if not cuda_ready():
        return
    if collect_garbage:
        gc.collect()
    torch = _torch()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def private_pool_bytes(r: MemoryReading, pool: str | None = None) -> int:
    """Reserved bytes of one private pool, or of all pools except the default one."""
    if pool is not None:
        return r.pool_reserved_bytes.get(pool, 0)
    return sum(v for k, v in r.pool_reserved_bytes.items() if k != DEFAULT_POOL)

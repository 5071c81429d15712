"""Every private or version-dependent torch call memest makes, in one place.

Each function returns a value or raises; callers (the recorder) catch and degrade. Import of
torch is deferred so that importing memest_instrumentation never imports torch.
"""

from __future__ import annotations

from typing import Any

from memest.snapshot.tags import DEFAULT_POOL, pool_key

# Per-event metadata (_set_memory_metadata) and the CUDAGraph Python class exist from this version.
MIN_METADATA_VERSION = (2, 10)


def _torch() -> Any:
    import torch

    return torch


def torch_version() -> tuple[int, int]:
    text = str(_torch().__version__).split("+")[0]
    parts = [p for p in text.split(".")[:2]]
    major = int(parts[0])
    minor = int("".join(ch for ch in parts[1] if ch.isdigit()) or 0) if len(parts) > 1 else 0
    return (major, minor)


def torch_version_text() -> str:
    return str(_torch().__version__)


def cuda_available() -> bool:
    return bool(_torch().cuda.is_available())


def cuda_initialized() -> bool:
    return bool(_torch().cuda.is_initialized())


def current_device() -> int:
    return int(_torch().cuda.current_device())


def metadata_supported() -> bool:
    """True when allocator events can carry a per-event metadata string."""
    mem = _torch().cuda.memory
    if torch_version() < MIN_METADATA_VERSION or not hasattr(mem, "_set_memory_metadata"):
        return False
    probe = getattr(mem, "_memory_metadata_supported", None)
    return bool(probe()) if probe is not None else True


def set_metadata(text: str) -> None:
    _torch().cuda.memory._set_memory_metadata(text)


def start_history(*, max_entries: int, stacks: str, context: str = "alloc") -> None:
    # context="alloc": stacks on alloc and segment events only; frees reuse the allocation's
    # stack, which halves the per-event cost and loses nothing the analysis reads.
    _torch().cuda.memory._record_memory_history(
        enabled="all", context=context, stacks=stacks, max_entries=max_entries
    )


def stop_history() -> None:
    _torch().cuda.memory._record_memory_history(enabled=None)


def raw_snapshot() -> dict[str, Any]:
    snap: dict[str, Any] = _torch().cuda.memory._snapshot()
    return snap


def traceless_snapshots_supported() -> bool:
    """True when the allocator's segments can be read without its trace history.

    A snapshot with traces converts every recorded event (with its stack) into Python objects:
    seconds to minutes once the history holds hundreds of thousands of events, so phase and
    stage readings must never ask for one while history is recording.
    """
    import inspect

    try:
        params = inspect.signature(_torch().cuda.memory.memory_snapshot).parameters
    except (TypeError, ValueError):
        return False
    return "include_traces" in params


def history_recording() -> bool:
    """True while torch records allocator history (its snapshot then carries traces)."""
    try:
        return bool(_torch()._C._cuda_isHistoryEnabled())
    except Exception:  # older torch: assume it may be on
        return True


def segments(device: int) -> list[dict[str, Any]]:
    """The allocator's segments on ``device``, without traces.

    Raises RuntimeError when the segments cannot be read cheaply (a torch without
    ``include_traces`` while history is recording): callers degrade to allocator totals.
    """
    torch = _torch()
    if traceless_snapshots_supported():
        found = torch.cuda.memory.memory_snapshot(include_traces=False)
    elif not history_recording():
        found = torch.cuda.memory_snapshot()
    else:
        raise RuntimeError("per-pool readings skipped: this torch snapshots only with traces")
    return [seg for seg in found if int(seg.get("device", device)) == device]


def pool_usage(
    device: int, found: list[dict[str, Any]] | None = None
) -> dict[str, tuple[int, int]]:
    """(reserved, allocated) bytes per allocator pool id, from its segments (``segments``, or
    ``found`` when already read)."""
    out: dict[str, tuple[int, int]] = {}
    for seg in segments(device) if found is None else found:
        key = pool_key(seg.get("segment_pool_id", (0, 0)))
        reserved, allocated = out.get(key, (0, 0))
        out[key] = (
            reserved + int(seg.get("total_size", 0)),
            allocated + int(seg.get("allocated_size", 0)),
        )
    return out


def stream_usage(found: list[dict[str, Any]], stream: int) -> tuple[int, int]:
    """(free, allocated) bytes of the default pool's segments made on CUDA stream ``stream``
    (its handle, ``torch.cuda.Stream.cuda_stream``): a free block serves only its own stream."""
    free = allocated = 0
    for seg in found:
        if int(seg.get("stream", 0)) != stream:
            continue
        if pool_key(seg.get("segment_pool_id", (0, 0))) != DEFAULT_POOL:
            continue
        allocated += int(seg.get("allocated_size", 0))
        free += int(seg.get("total_size", 0)) - int(seg.get("allocated_size", 0))
    return free, allocated


def pool_reserved(device: int) -> dict[str, int]:
    """Reserved bytes per pool id (see pool_usage)."""
    return {key: usage[0] for key, usage in pool_usage(device).items()}


def allocator_stats(device: int) -> tuple[int, int, int, int]:
    """(reserved, allocated, reserved peak, allocated peak) bytes."""
    cuda = _torch().cuda
    return (
        int(cuda.memory_reserved(device)),
        int(cuda.memory_allocated(device)),
        int(cuda.max_memory_reserved(device)),
        int(cuda.max_memory_allocated(device)),
    )


def mem_get_info(device: int) -> tuple[int, int]:
    free, total = _torch().cuda.mem_get_info(device)
    return int(free), int(total)


def pci_bus_id(device: int) -> str | None:
    props = _torch().cuda.get_device_properties(device)
    domain = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    dev = getattr(props, "pci_device_id", None)
    if domain is None or bus is None or dev is None:
        return None
    return f"{int(domain):08x}:{int(bus):02x}:{int(dev):02x}.0"


def graph_class() -> Any:
    """The Python CUDAGraph class whose capture_begin / capture_end memest wraps."""
    return _torch().cuda.CUDAGraph


def graph_pool_id(graph: Any) -> str:
    return pool_key(tuple(graph.pool()))

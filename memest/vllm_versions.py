"""The vLLM releases memest supports, one row each, and what differs between them.

A new vLLM release is a new row of ``VERSIONS``, not a fork: every figure memest takes from
vLLM's own defaults (memory utilization, KV block size, ``vllm serve``'s scheduler limits, the
startup-plan schema, the growable KV cache's margin constants) is read from the row of the
release in use. Pick the row with ``resolve_version``::

    from memest.vllm_versions import resolve_version

    row = resolve_version(None)  # the installed vLLM, else the newest supported
    row.gpu_memory_utilization(None)  # what an unset --gpu-memory-utilization resolves to
    row.extensible_kv  # vLLM 0.34's growable KV cache, or None

Every figure is vLLM's own, cited by file below, and checked against the installed vLLM by the
unit tests (tests/unit/test_vllm_versions.py).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from memest.errors import ConfigError

__all__ = [
    "NEWEST",
    "SUPPORTED",
    "VERSIONS",
    "KERNEL_BLOCKS",
    "ExtensibleKV",
    "ServeDefaults",
    "UnsupportedVllmVersion",
    "VllmVersion",
    "installed_vllm_version",
    "resolve_version",
]

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class ExtensibleKV:
    """vLLM's growable KV cache (``vllm/v1/worker/extensible_kv_cache.py``, CUDA figures).

    vLLM reserves the cache's address space, runs warm-up and capture beside a few committed
    blocks, then commits what the memory measured after capture allows, keeping free the
    measured transient peak plus a *margin* for what the measurement does not show.
    """

    #: ``KV_CACHE_MARGIN_FLOOR_BYTES``: the margin's floor (1 GiB on CUDA).
    margin_floor_bytes: int
    #: ``KV_CACHE_MARGIN_FRACTION``: the margin as a share of the transient peak.
    margin_fraction: float
    #: ``KV_CACHE_WARMUP_RESERVE_FRACTION``: share of the headroom warm-up leaves uncommitted.
    warmup_reserve_fraction: float
    #: ``KV_CACHE_NON_TORCH_RESERVE_BYTES``: kept free for allocations outside PyTorch's
    #: caching allocator (torch's reservation is capped to leave it), 512 MiB on CUDA.
    non_torch_reserve_bytes: int

    def margin_bytes(
        self,
        transient_peak_bytes: int,
        *,
        floor_bytes: int | None = None,
        fraction: float | None = None,
    ) -> int:
        """The margin kept beyond the transient peak: ``max(floor, fraction * peak)``, with
        vLLM's floor and fraction unless given."""
        floor = self.margin_floor_bytes if floor_bytes is None else floor_bytes
        share = self.margin_fraction if fraction is None else fraction
        return max(floor, int(transient_peak_bytes * share))

    def memest_margin_bytes(self, margin_bytes: int = 0) -> int:
        """The margin memest has the sizing keep instead of vLLM's guess: the non-torch reserve
        plus ``margin_bytes`` (MEMEST_MARGIN_BYTES).

        The reserve because vLLM caps PyTorch's allocator at what stays free less it
        (``measure_kv_cache_blocks``): a smaller margin would cap PyTorch below the transient
        peak the sizing keeps free, and serving's first full-size step would fail there.
        """
        return self.non_torch_reserve_bytes + margin_bytes

    def warmup_reserve_bytes(self, reserved_headroom_bytes: int, headroom_bytes: int) -> int:
        """What warm-up keeps uncommitted (``ExtensibleKVCache.committable_blocks``): the larger
        of the profiled peak and ``warmup_reserve_fraction`` of the headroom (free + committed)."""
        return max(reserved_headroom_bytes, int(headroom_bytes * self.warmup_reserve_fraction))

    def kv_cache_bytes(
        self,
        *,
        init_free_memory: int,
        free_memory: int,
        committed_bytes: int,
        requested_memory: int,
        transient_peak_bytes: int = 0,
        torch_reserve_growth_bytes: int = 0,
        margin_floor_bytes: int | None = None,
        margin_fraction: float | None = None,
    ) -> int:
        """Bytes the KV cache may commit after capture, as ``measure_kv_cache_bytes`` sizes it.

        Everything resident but the committed KV prefix is the engine's; the cache gets the rest
        of the requested budget, capped by the headroom (free + committed) less the margin, and
        the larger of the transient peak and torch's reservation growth is then kept free.

        Args:
            init_free_memory: device free bytes when the worker started.
            free_memory: device free bytes after capture (torch's cache emptied).
            committed_bytes: KV bytes physically committed at that reading.
            requested_memory: ``gpu_memory_utilization`` x total memory.
            transient_peak_bytes: ``ExtensibleKVCache.reserved_headroom_bytes``.
            torch_reserve_growth_bytes: ``ExtensibleKVCache.torch_reserve_growth_bytes``.
            margin_floor_bytes: the margin's floor; vLLM's own by default.
            margin_fraction: the margin's share of the transient peak; vLLM's own by default.
        """
        non_kv_used = init_free_memory - free_memory - committed_bytes
        headroom = free_memory + committed_bytes
        margin = self.margin_bytes(
            transient_peak_bytes, floor_bytes=margin_floor_bytes, fraction=margin_fraction
        )
        available = min(requested_memory - non_kv_used, headroom - margin)
        available -= max(transient_peak_bytes, torch_reserve_growth_bytes)
        return max(available, 0)

    def kept_free_bytes(
        self, transient_peak_bytes: int, torch_reserve_growth_bytes: int = 0
    ) -> int:
        """What the sizing keeps free beside the cache when the headroom binds: the margin plus
        the larger of the transient peak and torch's reservation growth."""
        return self.margin_bytes(transient_peak_bytes) + max(
            transient_peak_bytes, torch_reserve_growth_bytes
        )


@dataclass(frozen=True)
class ServeDefaults:
    """What ``vllm serve`` resolves when a limit is not given, on an H200-class GPU.

    ``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``): a GPU with at least
    70 GiB and under 160 GiB that is not an A100 (H100, H200) gets the OpenAI server's tier;
    ``max_model_len`` unset is the model config's derived maximum (``max_position_embeddings``).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    #: None: the model's own maximum context (vLLM derives it from config.json).
    max_model_len: int | None = None


#: Kernel block sizes per attention backend (``get_supported_kernel_block_sizes``, bf16/fp16 KV
#: cache, dense attention): a KV block may be any multiple of one of them ("multiple of 16" is
#: 16). Identical in vLLM 0.33.0 and 0.34.0 (every backend's method checked against both
#: releases' source); what differs is the default they are tried against (``default_block_size``).
KERNEL_BLOCKS: Mapping[str, tuple[int, ...]] = {
    "FLASH_ATTN": (16,),
    "FLASHINFER": (16, 32, 64),
    "TRITON_ATTN": (16,),
    "FLASH_ATTN_MLA": (16,),
    "FLASHMLA": (64,),
    "FLASHINFER_MLA": (32, 64),
    "TRITON_MLA": (16,),
    "CUTLASS_MLA": (128,),
    "FLASH_ATTN_MLA_SPARSE": (64,),
    "FLASHMLA_SPARSE": (64,),
    "FLASHINFER_MLA_SPARSE_SM90": (64,),
    "FLASH_ATTN_MLA_SPARSE_FA4": (64,),
    "FLASHINFER_MLA_SPARSE": (32,),
}


@dataclass(frozen=True)
class VllmVersion:
    """One supported vLLM release and the defaults memest takes from it."""

    #: The release, as ``importlib.metadata.version("vllm")`` reports it (local part dropped).
    version: str
    #: ``CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION`` (0.33.0: the field's default).
    default_gpu_memory_utilization: float
    #: ``CacheConfig.DEFAULT_BLOCK_SIZE``: tokens per KV block before a backend's own choice.
    default_block_size: int
    #: ``vllm/v1/worker/startup_plan.py: PLAN_SCHEMA_VERSION``.
    startup_plan_schema: int
    #: ``vllm serve``'s scheduler defaults on an H200-class GPU.
    serve_defaults: ServeDefaults
    #: The growable KV cache, None where the release has none. Where present it is on by
    #: default on CUDA (``VllmConfig._resolve_extensible_kv_cache``) unless
    #: ``kv_cache_memory_bytes`` or ``num_gpu_blocks_override`` is set.
    extensible_kv: ExtensibleKV | None = None
    #: ``resolved_gpu_memory_utilization`` unset with the growable cache on.
    extensible_gpu_memory_utilization: float = 1.0
    #: Kernel block sizes per attention backend (``KERNEL_BLOCKS``).
    kernel_blocks: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: KERNEL_BLOCKS)

    def supports_block_size(self, backend: str, block_size: int) -> bool:
        """``AttentionBackend.supports_block_size``: a multiple of one of the backend's kernel
        block sizes (a KV block may hold several kernel blocks)."""
        return any(block_size % k == 0 for k in self.kernel_blocks[backend])

    def preferred_block_size(self, backend: str) -> int:
        """The KV block size a start without ``--block-size`` gets on ``backend``
        (``Platform.update_block_size_for_backend`` -> ``get_preferred_block_size`` of
        ``CacheConfig.DEFAULT_BLOCK_SIZE``): the release's default when the backend takes it,
        else the backend's smallest kernel block size."""
        default = self.default_block_size
        if self.supports_block_size(backend, default):
            return default
        return min(self.kernel_blocks[backend])

    @property
    def extensible_by_default(self) -> bool:
        """Whether a CUDA start without the flags that turn it off sizes the KV cache growably."""
        return self.extensible_kv is not None

    def extensible(self, *, kv_cache_memory_bytes: int | None = None) -> bool:
        """Whether a CUDA start grows its KV cache: the release has it and no explicit KV size
        (``kv_cache_memory_bytes``, which a startup plan sets too) turns it off."""
        return self.extensible_by_default and kv_cache_memory_bytes is None

    def gpu_memory_utilization(
        self, requested: float | None, *, extensible: bool | None = None
    ) -> float:
        """``CacheConfig.resolved_gpu_memory_utilization``: ``requested`` when given, else 1.0
        with the growable KV cache (``extensible``; default: the release's CUDA default) and
        the release's default otherwise.

        Raises:
            ConfigError: ``requested`` is outside (0, 1] (vLLM refuses it too).
        """
        if requested is not None:
            if not 0 < requested <= 1:
                raise ConfigError("gpu_memory_utilization", requested, "must be in (0, 1]")
            return requested
        grows = self.extensible_by_default if extensible is None else extensible
        if grows and self.extensible_kv is not None:
            return self.extensible_gpu_memory_utilization
        return self.default_gpu_memory_utilization


# vLLM 0.33.0 and 0.34.0 resolve the same scheduler limits on an H200 (arg_utils.py).
_H200_SERVE = ServeDefaults(max_num_seqs=1024, max_num_batched_tokens=8192)

VERSIONS: tuple[VllmVersion, ...] = (
    VllmVersion(
        version="0.33.0",
        default_gpu_memory_utilization=0.92,
        default_block_size=16,
        startup_plan_schema=1,
        serve_defaults=_H200_SERVE,
    ),
    VllmVersion(
        version="0.34.0",
        default_gpu_memory_utilization=0.92,
        default_block_size=64,
        startup_plan_schema=2,
        serve_defaults=_H200_SERVE,
        extensible_kv=ExtensibleKV(
            margin_floor_bytes=1 * GIB,
            margin_fraction=0.75,
            warmup_reserve_fraction=0.1,
            non_torch_reserve_bytes=512 * MIB,
        ),
    ),
)
"""Every supported release, oldest first."""

SUPPORTED: tuple[str, ...] = tuple(row.version for row in VERSIONS)
NEWEST: VllmVersion = VERSIONS[-1]
_BY_VERSION = {row.version: row for row in VERSIONS}


class UnsupportedVllmVersion(ConfigError):
    """A vLLM release memest has no row for (its message names the supported ones)."""

    def __init__(self, version: str) -> None:
        super().__init__(
            "vllm_version", version, f"not a supported vLLM release ({', '.join(SUPPORTED)})"
        )


def _release(version: str) -> str:
    """``version`` without a local part ("0.34.0+cu129" -> "0.34.0"), stripped."""
    return re.sub(r"\+.*$", "", version.strip())


def installed_vllm_version() -> str | None:
    """The installed vLLM's version without its local part, or None when vLLM is absent.

    Reads the distribution's metadata, so vLLM (and torch) are never imported.
    """
    try:
        return _release(importlib.metadata.version("vllm"))
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve_version(requested: str | None = None) -> VllmVersion:
    """The row for ``requested``; None: the installed vLLM, else the newest supported release.

    Raises:
        UnsupportedVllmVersion: ``requested`` (or the installed vLLM, when nothing is
            requested) is not a supported release.
    """
    version = requested if requested is not None else installed_vllm_version()
    if version is None:
        return NEWEST
    row = _BY_VERSION.get(_release(version))
    if row is None:
        raise UnsupportedVllmVersion(version)
    return row

"""The KV block size vLLM picks: per attention backend, unless ``--block-size`` is given.

The rule is the release's (``memest.vllm_versions``: ``VllmVersion.preferred_block_size`` over
its ``kernel_blocks``): ``Platform.update_block_size_for_backend`` starts from
``CacheConfig.DEFAULT_BLOCK_SIZE``, 16 tokens on vLLM 0.33.0 and 64 on 0.34.0, with the same
kernel block sizes and priority lists in both releases. Without ``--block-size`` vLLM selects
the attention backend first (the first valid one of the platform's priority list, or
``--attention-backend``) and then takes that backend's ``get_preferred_block_size(default)``:
the default when the backend's kernels accept it, else the smallest size they accept. With
``--block-size`` the size is the user's, and only backends that accept it are valid (a backend
takes any multiple of one of its kernel block sizes). The kernel block sizes
(``get_supported_kernel_block_sizes``) and priority lists
(``platforms/cuda.py: _get_backend_priorities``) below are both releases' for a bf16/fp16 KV
cache, dense attention (no sparse MLA, no sliding window, no FP8 KV):

==============  ======================  =====  =====  ==============================================
backend         kernel block sizes      0.33   0.34   picked by default
==============  ======================  =====  =====  ==============================================
FLASH_ATTN      multiple of 16          16     64     Hopper (SM90), MHA/GQA
FLASHINFER      16, 32, 64              16     64     Blackwell (SM100), MHA/GQA
TRITON_ATTN     multiple of 16          16     64
FLASH_ATTN_MLA  multiple of 16          16     64     Hopper, MLA (needs FlashAttention 3: SM90)
FLASHMLA        64                      64     64
FLASHINFER_MLA  32, 64                  32     64     Blackwell, MLA
TRITON_MLA      multiple of 16          16     64
CUTLASS_MLA     128                     128    128    (Blackwell only)
==============  ======================  =====  =====  ==============================================

So on an H200 every default start has 16-token blocks on vLLM 0.33.0; ``--attention-backend
FLASHMLA`` makes them 64 and ``FLASHINFER_MLA`` 32. On vLLM 0.34.0 every backend above takes 64
(16, 32 and 64 all divide it) but CUTLASS_MLA, which keeps 128: every default start has 64-token
blocks, ``FLASHINFER_MLA`` and ``FLASHINFER_MLA_SPARSE`` too.

Sparse MLA (DeepSeek sparse attention: a config with ``index_topk``) takes only the sparse
backends; the lists (``_get_backend_priorities``; the dense MLA backends refuse
``use_sparse``) and their kernel block sizes (every one a multiple of 64 but FlashInfer's TRTLLM
sparse kernel, a multiple of 32):

=============================  ========  ===============================================
backend                        blocks    picked by default
=============================  ========  ===============================================
FLASH_ATTN_MLA_SPARSE          x 64      Hopper (needs FlashAttention 3's MLA kernels)
FLASHMLA_SPARSE                x 64      Hopper after it; Blackwell above 16 heads
FLASHINFER_MLA_SPARSE_SM90     x 64      Hopper, last (first for a 512-wide NoPE head)
FLASH_ATTN_MLA_SPARSE_FA4      x 64      Blackwell, 16 heads or fewer
FLASHINFER_MLA_SPARSE          x 32      Blackwell, second
=============================  ========  ===============================================

So a DSA start has 64-token blocks on an H200 whichever of its backends runs (16 is no multiple
of 64: ``get_preferred_block_size`` takes the smallest, 64).
"""

from __future__ import annotations

from memest.errors import ConfigError
from memest.vllm_versions import KERNEL_BLOCKS, VllmVersion, resolve_version

__all__ = ["KERNEL_BLOCKS", "kv_block_size", "preferred", "sparse_priorities", "supports"]


def supports(backend: str, block_size: int, vllm: VllmVersion | None = None) -> bool:
    """vLLM's ``supports_block_size`` on ``vllm``'s release (None: the installed, else the
    newest): a multiple of one of the kernel block sizes."""
    return (vllm or resolve_version()).supports_block_size(backend, block_size)


def preferred(backend: str, vllm: VllmVersion | None = None) -> int:
    """vLLM's ``get_preferred_block_size(DEFAULT_BLOCK_SIZE)`` on ``vllm``'s release (None: the
    installed, else the newest): its default when the backend takes it, else the backend's
    smallest kernel block size."""
    return (vllm or resolve_version()).preferred_block_size(backend)


#: Backends in priority order, by (SM100, MLA), those of KERNEL_BLOCKS only; vLLM 0.33.0's and
#: 0.34.0's ``_get_backend_priorities`` list them alike.
PRIORITIES: dict[tuple[bool, bool], tuple[str, ...]] = {
    (False, False): ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"),
    (False, True): ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"),
    (True, False): ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN"),
    (True, True): ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASHMLA", "TRITON_MLA"),
}


#: FlashAttention-4 sparse MLA leads on SM100 at this many heads per rank or fewer.
FA4_SPARSE_MAX_HEADS = 16


def sparse_priorities(*, sm100: bool, heads: int) -> tuple[str, ...]:
    """The sparse MLA backends in priority order (bf16 KV cache, head size 576)."""
    if not sm100:
        return ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90")
    if heads <= FA4_SPARSE_MAX_HEADS:
        return ("FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE")
    return ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE")


def kv_block_size(
    *,
    mla: bool,
    sm100: bool,
    backend: str | None = None,
    block_size: int | None = None,
    sparse: bool = False,
    heads: int = 128,
    vllm: VllmVersion | None = None,
) -> tuple[int, str]:
    """(block size, backend) of a start: ``vllm``'s rule (module docstring; None: the installed
    release, else the newest). ``sparse``: a DSA model (sparse MLA backends only); ``heads``:
    its attention heads per rank.

    Raises:
        ConfigError: an unknown backend, one of the wrong attention kind, or a block size no
            backend (or not the named one) accepts.
    """
    release = vllm or resolve_version()
    candidates = sparse_priorities(sm100=sm100, heads=heads) if sparse else PRIORITIES[(sm100, mla)]
    if backend is not None:
        name = backend.upper()
        if name not in release.kernel_blocks:
            raise ConfigError(
                "attention_backend", backend, f"expected one of {sorted(release.kernel_blocks)}"
            )
        if name not in candidates:
            kind = "sparse MLA (DSA)" if sparse else "MLA" if mla else "MHA/GQA"
            raise ConfigError(
                "attention_backend", backend, f"is not a {kind} backend of this GPU; {candidates}"
            )
        candidates = (name,)
    if block_size is None:
        return release.preferred_block_size(candidates[0]), candidates[0]
    for name in candidates:
        if release.supports_block_size(name, block_size):
            return block_size, name
    raise ConfigError(
        "block_size", block_size, f"no attention backend takes it ({', '.join(candidates)})"
    )

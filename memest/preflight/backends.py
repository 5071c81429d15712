"""The KV block size vLLM 0.33.0 picks: per attention backend, unless ``--block-size`` is given.

vLLM 0.33.0 (``Platform.update_block_size_for_backend``) starts from ``CacheConfig``'s default
of 16 tokens. Without ``--block-size`` it selects the attention backend first (the first valid
one of the platform's priority list, or ``--attention-backend``) and then takes that backend's
``get_preferred_block_size(16)``: 16 when the backend's kernels accept 16, else the smallest size
they accept. With ``--block-size`` the size is the user's, and only backends that accept it are
valid (a backend takes any multiple of one of its kernel block sizes). The kernel block sizes
(``get_supported_kernel_block_sizes``) and priority lists
(``platforms/cuda.py: _get_backend_priorities``) below are vLLM 0.33.0's for a bf16/fp16 KV
cache, dense attention (no sparse MLA, no sliding window, no FP8 KV):

==============  ======================  =========  ==============================================
backend         kernel block sizes      preferred  picked by default
==============  ======================  =========  ==============================================
FLASH_ATTN      multiple of 16          16         Hopper (SM90), MHA/GQA
FLASHINFER      16, 32, 64              16         Blackwell (SM100), MHA/GQA
TRITON_ATTN     multiple of 16          16
FLASH_ATTN_MLA  multiple of 16          16         Hopper, MLA (needs FlashAttention 3: SM90)
FLASHMLA        64                      64
FLASHINFER_MLA  32, 64                  32         Blackwell, MLA
TRITON_MLA      multiple of 16          16
CUTLASS_MLA     128                     128        (Blackwell only)
==============  ======================  =========  ==============================================

So on an H200 every default start has 16-token blocks; ``--attention-backend FLASHMLA`` makes
them 64 and ``FLASHINFER_MLA`` 32.

Sparse MLA (DeepSeek sparse attention: a config with ``index_topk``) takes only the sparse
backends; vLLM 0.33.0's lists (``_get_backend_priorities``; the dense MLA backends refuse
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

#: vLLM 0.33.0's CacheConfig.DEFAULT_BLOCK_SIZE (tokens per KV block).
DEFAULT_BLOCK_SIZE = 16


#: Kernel block sizes per backend (vLLM 0.33.0, bf16/fp16 KV cache); "multiple of 16" is 16.
KERNEL_BLOCKS: dict[str, tuple[int, ...]] = {
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


def supports(backend: str, block_size: int) -> bool:
    """vLLM's ``supports_block_size``: a multiple of one of the kernel block sizes (a KV block
    may hold several kernel blocks)."""
    return any(block_size % k == 0 for k in KERNEL_BLOCKS[backend])


def preferred(backend: str, default: int = DEFAULT_BLOCK_SIZE) -> int:
    """vLLM's ``get_preferred_block_size(default)``: the default when the backend takes it, else
    its smallest kernel block size."""
    return default if supports(backend, default) else min(KERNEL_BLOCKS[backend])


#: Backends in vLLM 0.33.0's priority order, by (SM100, MLA), those of KERNEL_BLOCKS only.
PRIORITIES: dict[tuple[bool, bool], tuple[str, ...]] = {
    (False, False): ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"),
    (False, True): ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"),
    (True, False): ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN"),
    (True, True): ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASHMLA", "TRITON_MLA"),
}


#: vLLM 0.33.0's FlashAttention-4 sparse MLA leads on SM100 at this many heads per rank or fewer.
FA4_SPARSE_MAX_HEADS = 16


def sparse_priorities(*, sm100: bool, heads: int) -> tuple[str, ...]:
    """vLLM 0.33.0's sparse MLA backends in priority order (bf16 KV cache, head size 576)."""
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
) -> tuple[int, str]:
    """(block size, backend) of a start: vLLM 0.33.0's rule (module docstring). ``sparse``: a
    DSA model (sparse MLA backends only); ``heads``: its attention heads per rank.

    Raises:
        ConfigError: an unknown backend, one of the wrong attention kind, or a block size no
            backend (or not the named one) accepts.
    """
    candidates = sparse_priorities(sm100=sm100, heads=heads) if sparse else PRIORITIES[(sm100, mla)]
    if backend is not None:
        name = backend.upper()
        if name not in KERNEL_BLOCKS:
            raise ConfigError(
                "attention_backend", backend, f"expected one of {sorted(KERNEL_BLOCKS)}"
            )
        if name not in candidates:
            kind = "sparse MLA (DSA)" if sparse else "MLA" if mla else "MHA/GQA"
            raise ConfigError(
                "attention_backend", backend, f"is not a {kind} backend of this GPU; {candidates}"
            )
        candidates = (name,)
    if block_size is None:
        return preferred(candidates[0]), candidates[0]
    for name in candidates:
        if supports(name, block_size):
            return block_size, name
    raise ConfigError(
        "block_size", block_size, f"no attention backend takes it ({', '.join(candidates)})"
    )

"""MLA prefill over cached context: the reservation vLLM 0.33.0's profile run leaves out (bytes).

A request whose prompt prefix is in the prefix cache (on by default) prefills only its new
tokens, attending to the cached prefix as context. Multi-head latent attention keeps one latent
vector per token in the cache, so ``MLACommonImpl._compute_prefill_context``
(``model_executor/layers/attention/mla_attention.py``) reads the context back into its
chunked-prefill workspace and, per chunk of up to ``workspace`` tokens, up-projects it:

- ``kv_nope = kv_b_proj(kv_c)``: [tokens, heads, qk_nope + v];
- ``k = cat(k_nope, k_pe)`` (``_concat_k_nope_k_pe``): [tokens, heads, qk_nope + qk_rope];
- with FlashAttention 2 (``FlashAttnPrefillBackend.requires_v_padding``), v padded to the qk
  head dim: [tokens, heads, qk_nope + qk_rope]. FlashAttention 3 on SM90 and 4 take v as is.

The profile run (attention skipped) allocates only a stand-in of the first, one
[workspace, heads, qk_nope + v] tensor, so its activation peak misses k and the padded v. Measured
on an H200 (reports/vllm, call 17): DeepSeek-V2-Lite's shape, 16 heads, 32,768-token workspace,
FA2: a step over cached context reserved 640 MiB beyond serving's first full-size step, exactly
the three tensors.

The chunk runs while little else of the step is live (its new tokens are few), and its tensors
take segments of their own: the reservation beyond the activation headroom is the chunk less the
stand-in the headroom already holds, each tensor rounded to the allocator's 2 MiB.
"""

from __future__ import annotations

import math

from memest.errors import ConfigError
from memest.estimate.model_shape import ModelShape, model_shape
from memest.schema import RunConfig

#: vLLM 0.33.0 MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size: room for 8
#: full-length requests or at least 4 pages per request, capped at 64k tokens.
WORKSPACE_MAX_MODEL_LENS = 8
WORKSPACE_PAGES_PER_SEQ = 4
WORKSPACE_CAP_TOKENS = 64 * 1024
#: Large allocations are rounded up to this by PyTorch's caching allocator.
LARGE_ROUND_BYTES = 2 << 20


def chunked_prefill_workspace_tokens(max_model_len: int, max_num_seqs: int, block_size: int) -> int:
    """Tokens of context MLA up-projects at once (one chunk)."""
    wanted = max(
        WORKSPACE_MAX_MODEL_LENS * max_model_len,
        WORKSPACE_PAGES_PER_SEQ * max_num_seqs * block_size,
    )
    return min(wanted, WORKSPACE_CAP_TOKENS)


def _rounded(nbytes: int) -> int:
    return math.ceil(nbytes / LARGE_ROUND_BYTES) * LARGE_ROUND_BYTES


def context_chunk_tensors(
    shape: ModelShape, workspace_tokens: int, *, v_padded: bool
) -> dict[str, int]:
    """Bytes of each tensor one full context chunk allocates (per rank), by name."""
    if shape.family != "mla" or workspace_tokens <= 0:
        return {}
    rows = workspace_tokens * shape.heads * shape.dtype_bytes
    qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    tensors = {"kv_nope": rows * (shape.qk_nope_head_dim + shape.v_head_dim), "k": rows * qk}
    if v_padded:
        tensors["v_padded"] = rows * qk
    return tensors


def profile_standin_bytes(shape: ModelShape, workspace_tokens: int) -> int:
    """The profile run's stand-in for the chunk, [workspace, heads, qk_nope + v] (0 without MLA).

    Part of the profile run's activation peak, which the plugin measures; the pre-flight's
    activation law, fitted on models without MLA, adds it.
    """
    tensors = context_chunk_tensors(shape, workspace_tokens, v_padded=False)
    return _rounded(tensors["kv_nope"]) if tensors else 0


def mla_context_bytes(shape: ModelShape, workspace_tokens: int, *, v_padded: bool) -> int:
    """Reservation a full context chunk needs beyond the profile run's stand-in (0 without MLA)."""
    tensors = context_chunk_tensors(shape, workspace_tokens, v_padded=v_padded)
    chunk = sum(_rounded(n) for n in tensors.values())
    return chunk - profile_standin_bytes(shape, workspace_tokens)


def run_mla_context_bytes(config: RunConfig, block_size: int) -> int:
    """The term for one start from its configuration (0 without MLA or a dimension it needs).

    The model's recorded dimensions give the shape per rank; the prefill backend's padding of v
    is the recorded one, else assumed (FlashAttention 2 pads: the larger reservation).
    """
    dims = config.model_dims
    if dims is None or not dims.kv_lora_rank or not config.max_model_len:
        return 0
    try:
        shape = model_shape(
            dims.model_dump(exclude_none=True) | {"torch_dtype": dims.dtype},
            tp=config.tensor_parallel_size,
        )
    except ConfigError:
        return 0
    tokens = chunked_prefill_workspace_tokens(
        config.max_model_len, config.max_num_seqs or 1, block_size
    )
    padded = True if config.mla_prefill_v_padded is None else config.mla_prefill_v_padded
    return mla_context_bytes(shape, tokens, v_padded=padded)

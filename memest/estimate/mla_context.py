"""MLA's prefill up-projection: the reservation vLLM 0.33.0's profile run leaves out (bytes).

Multi-head latent attention keeps one latent vector per token in the KV cache, so its prefill
(``MLACommonImpl.forward_mha`` in ``model_executor/layers/attention/mla_attention.py``)
up-projects latent rows into per-head tensors before calling the prefill backend:

- ``kv_nope = kv_b_proj(kv_c)``: [tokens, heads, qk_nope + v];
- ``k = cat(k_nope, k_pe)`` (``_concat_k_nope_k_pe``): [tokens, heads, qk_nope + qk_rope];
- with FlashAttention 2 (``FlashAttnPrefillBackend.requires_v_padding``), v padded to the qk
  head dim: [tokens, heads, qk_nope + qk_rope]. FlashAttention 3 on SM90 and 4 take v as is.

vLLM's profile run skips attention, so its activation peak holds none of them. Serving does both:

- the step's new tokens: a full-size step up-projects max_num_batched_tokens rows;
- cached context: a request whose prompt prefix is in the prefix cache (on by default) prefills
  only its new tokens and reads the prefix back from the cache (``_compute_prefill_context``),
  up-projecting it per chunk of up to the chunked-prefill workspace's rows. The profile run
  allocates one [workspace, heads, qk_nope + v] stand-in for it.

Measured on an H200 (reports/vllm, calls 17 and 19): DeepSeek-V2-Lite's shape, 16 heads, FA2: the
first full-size step (2,047 tokens) reserved 40 MiB beyond memest's warm profile pass, the three
tensors' bytes (there kv_nope, padded v and the attention output, of k's size, took segments; k
reused a freed block), and a step over cached context 640 MiB more, the three tensors of one
32,768-row chunk. Each takes segments of its own, rounded to the allocator's 2 MiB. The
term is both, less the stand-in where the activation headroom holds it: the vLLM plugin's warm
profile pass runs without it (``config.mla_warm_pass_without_standin``); vLLM's own profile run,
and the pre-flight's activation law, hold it.
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


def up_projection_tensors(shape: ModelShape, tokens: int, *, v_padded: bool) -> dict[str, int]:
    """Bytes of each tensor MLA's prefill allocates to up-project ``tokens`` rows (per rank)."""
    if shape.family != "mla" or tokens <= 0:
        return {}
    rows = tokens * shape.heads * shape.dtype_bytes
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
    tensors = up_projection_tensors(shape, workspace_tokens, v_padded=False)
    return _rounded(tensors["kv_nope"]) if tensors else 0


def _reserved(shape: ModelShape, tokens: int, *, v_padded: bool) -> int:
    return sum(
        _rounded(n) for n in up_projection_tensors(shape, tokens, v_padded=v_padded).values()
    )


def mla_context_bytes(
    shape: ModelShape,
    workspace_tokens: int,
    step_tokens: int,
    *,
    v_padded: bool,
    standin_in_headroom: bool = True,
) -> int:
    """Reservation MLA's prefill needs beyond the activation headroom (0 without MLA).

    ``step_tokens``: the widest step's new tokens (max_num_batched_tokens);
    ``standin_in_headroom``: the headroom already holds the profile run's stand-in for the chunk.
    """
    if shape.family != "mla":
        return 0
    reserved = _reserved(shape, workspace_tokens, v_padded=v_padded) + _reserved(
        shape, step_tokens, v_padded=v_padded
    )
    held = profile_standin_bytes(shape, workspace_tokens) if standin_in_headroom else 0
    return reserved - held


def run_mla_context_bytes(config: RunConfig, block_size: int) -> int:
    """The term for one start from its configuration (0 without MLA or a dimension it needs).

    The model's recorded dimensions give the shape per rank; the prefill backend's padding of v
    is the recorded one, else assumed (FlashAttention 2 pads: the larger reservation). The
    headroom holds the profile run's stand-in unless memest's warm pass recorded running without.
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
    return mla_context_bytes(
        shape,
        tokens,
        config.max_num_batched_tokens or 0,
        v_padded=padded,
        standin_in_headroom=not config.mla_warm_pass_without_standin,
    )

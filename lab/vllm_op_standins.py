"""Torch stand-ins for the compiled vLLM 0.33.0 ops that its MoE and MLA paths still call.

Device-harness code (lab tooling, not product). On the lent H200 vLLM runs without its CUDA
extensions (see the shared vllm-h200 folder): `_C` op schemas come from a shim, `_moe_C` has none.
A Qwen3-MoE or DeepSeek-V2 start then stops in the router at `_moe_C.topk_softmax`. The unquantized
Triton fused-MoE path (`TritonExperts`) and TRITON_MLA call, at tensor-parallel size 1:

- `_moe_C.topk_softmax` / `_moe_C.topk_sigmoid`: `FusedTopKRouter` and `FusedTopKBiasRouter`
  (`fused_moe/router/fused_topk_router.py`, `fused_topk_bias_router.py`);
- `_moe_C.moe_align_block_size`: `fused_moe/moe_align_block_size.py`, before the Triton GEMMs;
- `_moe_C.moe_sum`: `TritonExperts.moe_sum` (`fused_moe/experts/triton_moe.py`) for top_k > 1;
- `_C_cache_ops.concat_and_cache_mla`: the MLA KV-cache write (`v1/attention/backend.py`,
  `MLACommonBackend.do_kv_cache_update`);
- `_vllm_fa2_C.varlen_fwd`: FlashAttention-2's varlen forward, which vLLM's FLASH_ATTN MLA
  prefill backend (`v1/attention/backends/mla/prefill/flash_attn.py`) reaches through
  `vllm_flash_attn.flash_attn_varlen_func`. On SM90 that is the only prefill backend vLLM picks
  itself; `provide_flash_attn_v2` makes vLLM see FA2 as available, and the stand-in runs
  PyTorch's own FlashAttention-2 kernel (`aten._flash_attention_forward`), which allocates what
  the vLLM kernel does: the output and the float32 log-sum-exp, no score matrix;
- `_C_cache_ops.gather_and_maybe_dequant_cache` and `_C.merge_attn_states`: MLA prefill over
  cached context (`MLACommonImpl._compute_prefill_context`, mla_attention.py): a request whose
  prompt prefix is in the prefix cache reads that context back from the KV cache, attends to it,
  and merges the result with the new tokens' attention.

`silu_and_mul` (the experts' activation) already has a torch kernel in the shim. Every stand-in
below is graph-capturable: fixed output shapes, no host synchronisation, no `.item()`, no Python
branch on tensor values, so vLLM's CUDA-graph capture records it like the CUDA kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.library import Library

# Schemas as vLLM 0.33.0's compiled extensions register them (read from the strings of
# _moe_C_stable_libtorch.abi3.so and _C_stable_libtorch.abi3.so), so vLLM's wrappers in
# vllm/_custom_ops.py bind their arguments exactly as against the real ops.
SCHEMAS: dict[tuple[str, str], str] = {
    ("_moe_C", "topk_softmax"): (
        "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
        "Tensor gating_output, bool renormalize, Tensor? bias, Tensor? is_padding) -> ()"
    ),
    ("_moe_C", "topk_sigmoid"): (
        "topk_sigmoid(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
        "Tensor gating_output, bool renormalize, Tensor? bias, float routed_scaling_factor, "
        "Tensor? is_padding) -> ()"
    ),
    ("_moe_C", "moe_align_block_size"): (
        "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, "
        "Tensor! sorted_token_ids, Tensor! experts_ids, Tensor! num_tokens_post_pad, "
        "Tensor? maybe_expert_map, Tensor(a!)? scatter_idx=None) -> ()"
    ),
    ("_moe_C", "moe_sum"): (
        "moe_sum(Tensor input, Tensor! output, Tensor? topk_ids=None, "
        "Tensor? expert_map=None) -> ()"
    ),
    ("_C_cache_ops", "concat_and_cache_mla"): (
        "concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor! kv_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, Tensor scale, bool skip_scale=False) -> ()"
    ),
    ("_C_cache_ops", "gather_and_maybe_dequant_cache"): (
        "gather_and_maybe_dequant_cache(Tensor src_cache, Tensor! dst, Tensor block_table, "
        "Tensor cu_seq_lens, Tensor token_to_seq, int num_tokens, str kv_cache_dtype, "
        "Tensor scale, Tensor? seq_starts) -> ()"
    ),
    ("_C", "merge_attn_states"): (
        "merge_attn_states(Tensor! output, Tensor!? output_lse, Tensor prefix_output, "
        "Tensor prefix_lse, Tensor suffix_output, Tensor suffix_lse, "
        "int!? prefill_tokens_with_context, Tensor? output_scale=None) -> ()"
    ),
    ("_C", "dsv3_fused_a_gemm"): (
        "dsv3_fused_a_gemm(Tensor! output, Tensor mat_a, Tensor mat_b, bool enable_pdl=False) -> ()"
    ),
    (
        "_C",
        "rms_norm",
    ): "rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()",
    ("_C", "silu_and_mul"): "silu_and_mul(Tensor! result, Tensor input) -> ()",
    # read from the strings of vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so
    ("_vllm_fa2_C", "varlen_fwd"): (
        "varlen_fwd(Tensor! q, Tensor k, Tensor v, Tensor!? out, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, Tensor? seqused_k, Tensor? leftpad_k, Tensor? block_table, "
        "Tensor? alibi_slopes, int max_seqlen_q, int max_seqlen_k, float p_dropout, "
        "float softmax_scale, bool zero_tensors, bool is_causal, int window_size_left, "
        "int window_size_right, float softcap, bool return_softmax, int num_splits, "
        "Tensor? gen) -> Tensor[]"
    ),
}


# --------------------------------------------------------------------------- routers
def _select(
    scores: torch.Tensor,
    k: int,
    renormalize: bool,
    bias: torch.Tensor | None,
    scaling: float,
    is_padding: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k weights and expert ids of `scores` (num_tokens x num_experts, float32).

    Selection uses scores + bias, the weights are the unbiased scores (vLLM's torch fallback
    `fused_topk_bias` in fused_moe/router/fused_topk_bias_router.py does the same); renormalise,
    then scale. Padding rows (is_padding, vLLM's forward-context mask) get weight 0 and expert
    -1, as vLLM's own Triton router kernel `_dsv4_topk_kernel` writes them: the alignment then
    skips them, and the Triton fused-MoE kernel writes zeros for an expert id of -1 (its
    small-batch path reads topk_ids directly, fused_moe.py `off_experts == -1`).
    """
    choice = scores if bias is None else scores + bias.float()
    # a stable descending sort: of equal scores the lower expert id wins, as in the CUDA kernel
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * scaling
    if is_padding is not None:
        pad = is_padding[: scores.shape[0]].bool().unsqueeze(1)
        weights = weights.masked_fill(pad, 0.0)
        ids = ids.masked_fill(pad, -1)
    return weights, ids


def _store(
    selected: tuple[torch.Tensor, torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    token_expert_indices: torch.Tensor,
) -> None:
    """Into the caller's buffers; token_expert_indices[t, j] = j * num_tokens + t (the
    kernel's `source_rows`)."""
    weights, ids = selected
    num_tokens, k = ids.shape
    topk_weights.copy_(weights)
    topk_ids.copy_(ids)
    rows = torch.arange(num_tokens, device=ids.device, dtype=torch.int32)
    slots = torch.arange(k, device=ids.device, dtype=torch.int32)
    token_expert_indices.copy_(slots.unsqueeze(0) * num_tokens + rows.unsqueeze(1))


def topk_softmax(
    topk_weights: torch.Tensor,
    topk_indices: torch.Tensor,
    token_expert_indices: torch.Tensor,
    gating_output: torch.Tensor,
    renormalize: bool,
    bias: torch.Tensor | None,
    is_padding: torch.Tensor | None,
) -> None:
    """`_moe_C::topk_softmax`: float32 softmax over the experts, then top-k (no scaling).

    Reference: csrc/moe/topk_softmax_kernels.cu (softmax in float, the lower expert id wins a
    tie) and the torch fallback named in `_select`.
    """
    scores = torch.softmax(gating_output.float(), dim=-1)
    k = topk_indices.shape[1]
    selected = _select(scores, k, renormalize, bias, 1.0, is_padding)
    _store(selected, topk_weights, topk_indices, token_expert_indices)


def topk_sigmoid(
    topk_weights: torch.Tensor,
    topk_indices: torch.Tensor,
    token_expert_indices: torch.Tensor,
    gating_output: torch.Tensor,
    renormalize: bool,
    bias: torch.Tensor | None,
    routed_scaling_factor: float,
    is_padding: torch.Tensor | None,
) -> None:
    """`_moe_C::topk_sigmoid`: float32 sigmoid scores, top-k, renormalise, then scale.

    Reference: vLLM's torch fallback `fused_topk_bias` (scoring_func="sigmoid").
    """
    scores = torch.sigmoid(gating_output.float())
    k = topk_indices.shape[1]
    selected = _select(scores, k, renormalize, bias, routed_scaling_factor, is_padding)
    _store(selected, topk_weights, topk_indices, token_expert_indices)


# --------------------------------------------------------------------------- alignment
def _valid_routes(
    flat_ids: torch.Tensor, num_experts: int, expert_map: torch.Tensor | None
) -> torch.Tensor:
    """Routes that count: an expert id in range and, with an expert map, one on this rank."""
    valid = (flat_ids >= 0) & (flat_ids < num_experts)
    if expert_map is not None:
        local = expert_map.long()[flat_ids.clamp(0, num_experts - 1)]
        valid = valid & (local >= 0)
    return valid


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    experts_ids: torch.Tensor,
    num_tokens_post_pad: torch.Tensor,
    maybe_expert_map: torch.Tensor | None,
    scatter_idx: torch.Tensor | None = None,
) -> None:
    """`_moe_C::moe_align_block_size`: group the flattened routes by expert in padded blocks.

    Semantics of vLLM's golden `torch_moe_align_block_size` (tests/kernels/moe/
    test_moe_align_block_size.py) and the docstring of fused_moe/moe_align_block_size.py:
    each expert's routes (flat indices into topk_ids) fill a run of whole blocks, experts in
    ascending order, empty experts take no block; unused slots hold the sentinel topk_ids.numel();
    experts_ids[b] is the expert of block b (its local id when an expert map is given; experts
    mapped to -1 and ids outside [0, num_experts) are skipped), 0 after the last used block;
    num_tokens_post_pad = the padded total; scatter_idx[i] = i for a counted route, else -1.
    Within an expert the routes keep their flat order (the CUDA kernel promises any order).
    """
    flat = topk_ids.flatten().long()
    device = flat.device
    valid = _valid_routes(flat, num_experts, maybe_expert_map)
    bucket = torch.where(valid, flat, num_experts)  # uncounted routes sort after every expert
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts[:num_experts] + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    first_sorted = counts.cumsum(0) - counts  # where each expert's routes start once sorted
    starts = torch.cat([ends - padded, ends.new_zeros(1)])
    sorted_bucket, order = torch.sort(bucket, stable=True)
    rank = torch.arange(flat.numel(), device=device) - first_sorted[sorted_bucket]
    capacity = sorted_token_ids.numel()
    dest = torch.where(sorted_bucket < num_experts, starts[sorted_bucket] + rank, capacity)
    staged = torch.full((capacity + 1,), flat.numel(), dtype=torch.long, device=device)
    staged.scatter_(0, dest, order)  # the extra last slot takes the uncounted routes
    sorted_token_ids.copy_(staged[:capacity])
    _fill_block_experts(experts_ids, ends, block_size, maybe_expert_map)
    num_tokens_post_pad.copy_(ends[-1:])
    if scatter_idx is not None:
        rows = torch.arange(flat.numel(), device=device)
        scatter_idx.copy_(torch.where(valid, rows, -1).view(scatter_idx.shape))


def _fill_block_experts(
    experts_ids: torch.Tensor,
    ends: torch.Tensor,
    block_size: int,
    expert_map: torch.Tensor | None,
) -> None:
    """experts_ids[b]: the expert whose padded run holds block b; 0 past the padded total."""
    block_starts = torch.arange(experts_ids.numel(), device=ends.device) * block_size
    owner = torch.searchsorted(ends, block_starts, right=True)
    owner = owner.clamp(max=ends.numel() - 1)
    if expert_map is not None:
        owner = expert_map.long()[owner]
    used = block_starts < ends[-1]
    experts_ids.copy_(torch.where(used, owner, 0))


def moe_sum(
    input: torch.Tensor,
    output: torch.Tensor,
    topk_ids: torch.Tensor | None = None,
    expert_map: torch.Tensor | None = None,
) -> None:
    """`_moe_C::moe_sum`: output[t] = sum over the top-k slots of input[t, slot, :].

    With topk_ids and expert_map, slots whose expert is not on this rank (map -1) are skipped,
    as `TritonExperts.moe_sum` (fused_moe/experts/triton_moe.py) says. vLLM's tests compare the
    kernel with torch.sum(input, dim=1). The CUDA kernel writes into `output` and allocates
    nothing, so neither does this one without an expert map: torch.sum reduces straight into
    `output` (accumulating bf16 in float32). An earlier version summed `input.float()`, a
    float32 copy of the whole [tokens, top_k, hidden] input (128 MiB per layer for Qwen3-MoE at
    2,047 tokens), which the H200 starts of calls 12 and 14 allocated and vLLM does not
    (reports/vllm/README.md, "MoE and MLA at serving's first full-size step").
    """
    if topk_ids is not None and expert_map is not None:
        ids = topk_ids.long()
        num_experts = expert_map.numel()
        kept = (ids >= 0) & (ids < num_experts)
        kept = kept & (expert_map.long()[ids.clamp(0, num_experts - 1)] >= 0)
        input = torch.where(kept.unsqueeze(-1), input, 0.0)  # expert parallelism only
    torch.sum(input, dim=1, out=output)


# --------------------------------------------------------------------------- MLA cache
def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    scale: torch.Tensor,
    skip_scale: bool = False,
) -> None:
    """`_C_cache_ops::concat_and_cache_mla` for kv_cache_dtype "auto".

    kv_cache is [num_blocks, block_size, kv_lora_rank + rope_dim]; token i with slot s >= 0 writes
    concat(kv_c[i], k_pe[i]) at [s // block_size, s % block_size]; slot -1 (padding) writes nothing
    (csrc/cache_kernels.cu; vLLM's tests/kernels/attention/test_cache.py builds its reference the
    same way). Graph-capturable: padding rows rewrite slot 0 with its own old value. Slot 0 is
    in block 0, vLLM's null block, which the KV-cache manager never hands to a request.
    """
    if kv_cache_dtype != "auto":
        raise NotImplementedError(f"concat_and_cache_mla stand-in: kv_cache_dtype {kv_cache_dtype}")
    num_tokens = slot_mapping.shape[0]
    slots = slot_mapping.long()
    written = slots >= 0
    safe = torch.where(written, slots, 0)
    block, offset = safe // kv_cache.shape[1], safe % kv_cache.shape[1]
    entry = torch.cat([kv_c[:num_tokens], k_pe[:num_tokens].reshape(num_tokens, -1)], dim=-1)
    kept = kv_cache[block, offset]
    kv_cache[block, offset] = torch.where(written.unsqueeze(1), entry.to(kv_cache.dtype), kept)


def gather_and_maybe_dequant_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor,
    seq_starts: torch.Tensor | None,
) -> None:
    """`_C_cache_ops::gather_and_maybe_dequant_cache` for kv_cache_dtype "auto".

    src_cache [num_blocks, block_size, entry], dst [total_tokens, entry]: token i of the chunk
    belongs to sequence b = token_to_seq[i] and sits at position p = i - cu_seq_lens[b]
    (+ seq_starts[b]) of it, which is slot p % block_size of block block_table[b, p // block_size]
    (csrc/cache_kernels.cu; AITER's Triton port documents the same layout). No host read; the
    rows are gathered straight into dst when the cache's blocks are one contiguous run.
    """
    if kv_cache_dtype != "auto":
        raise NotImplementedError(
            f"gather_and_maybe_dequant_cache stand-in: kv_cache_dtype {kv_cache_dtype}"
        )
    seq = token_to_seq[:num_tokens].long()
    pos = torch.arange(num_tokens, device=dst.device) - cu_seq_lens.long()[seq]
    if seq_starts is not None:
        pos = pos + seq_starts.long()[seq]
    block_size = src_cache.shape[1]
    block = block_table.long()[seq, pos // block_size]
    rows = block * block_size + pos % block_size
    target = dst[:num_tokens].view(num_tokens, -1)
    try:
        flat = src_cache.view(-1, target.shape[1])  # no copy of the cache
    except RuntimeError:  # strided cache: gather by (block, slot)
        target.copy_(src_cache[block, pos % block_size].reshape(num_tokens, -1))
        return
    torch.index_select(flat, 0, rows, out=target)


def merge_attn_states(
    output: torch.Tensor,
    output_lse: torch.Tensor | None,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    prefill_tokens_with_context: int | None,
    output_scale: torch.Tensor | None = None,
) -> None:
    """`_C::merge_attn_states`: combine two partial attentions by their log-sum-exp.

    Outputs [tokens, heads, d], lse [heads, tokens]. For tokens below prefill_tokens_with_context
    (all when None): out = (e^(lp - m) op + e^(ls - m) os) / (e^(lp - m) + e^(ls - m)) with
    m = max(lp, ls), lse = m + log of that sum; an lse of +inf counts as -inf (an empty part),
    two empty parts give 0 and -inf. Later tokens take the suffix as is. (The docstring of
    vllm/v1/attention/ops/merge_attn_states.py and its CPU fallback.)
    """
    if output_scale is not None:
        raise NotImplementedError("merge_attn_states stand-in: FP8 output")
    num_tokens = output.shape[0]
    merged_tokens = (
        num_tokens if prefill_tokens_with_context is None else prefill_tokens_with_context
    )
    if merged_tokens < num_tokens:
        output[merged_tokens:].copy_(suffix_output[merged_tokens:])
        if output_lse is not None:
            output_lse[:, merged_tokens:].copy_(suffix_lse[:, merged_tokens:])
    if merged_tokens == 0:
        return

    def empty_as_minus_inf(lse: torch.Tensor) -> torch.Tensor:
        lse = lse[:, :merged_tokens].float()
        return lse.masked_fill(torch.isposinf(lse), float("-inf"))

    lp, ls = empty_as_minus_inf(prefix_lse), empty_as_minus_inf(suffix_lse)
    top = torch.maximum(lp, ls)
    both_empty = top == float("-inf")
    safe_top = top.masked_fill(both_empty, 0.0)
    wp, ws = torch.exp(lp - safe_top), torch.exp(ls - safe_top)
    total = wp + ws
    scale_p = (wp / total).nan_to_num(0.0).transpose(0, 1).unsqueeze(-1)
    scale_s = (ws / total).nan_to_num(0.0).transpose(0, 1).unsqueeze(-1)
    merged = (
        prefix_output[:merged_tokens].float() * scale_p
        + suffix_output[:merged_tokens].float() * scale_s
    )
    output[:merged_tokens].copy_(merged.to(output.dtype))
    if output_lse is not None:
        lse = (torch.log(total) + safe_top).masked_fill(both_empty, float("-inf"))
        output_lse[:, :merged_tokens].copy_(lse)


# --------------------------------------------------------------------------- DeepSeek-V3, DSpark
def dsv3_fused_a_gemm(
    output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor, enable_pdl: bool = False
) -> None:
    """`_C::dsv3_fused_a_gemm`: output = mat_a @ mat_b, BF16, into output (vllm/_custom_ops.py).

    DeepSeek-V2/V3's fused q/kv A-projection calls it for 1 to 16 tokens when hidden_size is
    7,168 (`_min_latency_fused_qkv_a_proj` in deepseek_v2.py); mat_b is the weight's transposed
    view. Writes only into ``output``.
    """
    torch.mm(mat_a, mat_b, out=output)


def rms_norm(
    result: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, epsilon: float
) -> None:
    """`_C::rms_norm`, with its grouped form: a weight of shape [G, H] normalises x[g] with
    weight[g] (x of shape [G, ..., H]; DFlash/DSpark's context-K norm, one weight per draft
    layer, `_normalize_context_k` in qwen3_dflash.py). A [H] weight or none is the plain norm,
    the same arithmetic as the shim's: float32 x * rsqrt(mean(x^2) + eps), cast back, times w.
    """
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)).to(x.dtype)
    if weight is None:
        result.copy_(normed)
    elif weight.dim() == 1:
        result.copy_(normed * weight)
    else:
        groups, hidden = weight.shape[0], weight.shape[-1]
        result.copy_(normed * weight.view(groups, *([1] * (x.dim() - 2)), hidden))


# --------------------------------------------------------------------------- FlashAttention-2
def silu_and_mul(result: torch.Tensor, x: torch.Tensor) -> None:
    """`_C::silu_and_mul`: result = silu(x[..., :d]) * x[..., d:], in result's own storage.

    vLLM's CUDA kernel (csrc/activation_kernels.cu) writes into ``result`` and allocates
    nothing. The carry's shim computes ``F.silu(x[..., :d]) * x[..., d:]``, two temporaries
    of result's size: the fused-MoE experts call it on [tokens x top_k, intermediate] (Mixtral
    at 2,047 tokens: 224 MiB, call 35's step history), which no deployment allocates. Here
    silu is applied in place (rounded to the dtype once more than the kernel's float32 math;
    the lab's weights are random).
    """
    d = x.shape[-1] // 2
    result.copy_(x[..., :d])
    torch.nn.functional.silu(result, inplace=True)
    result.mul_(x[..., d:])


def _unsupported_varlen(**options: Any) -> list[str]:
    """The varlen_fwd features MLA prefill never uses; the stand-in refuses them by name."""
    return [name for name, used in options.items() if used]


def varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor | None,
    leftpad_k: torch.Tensor | None,
    block_table: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    p_dropout: float,
    softmax_scale: float,
    zero_tensors: bool,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    return_softmax: bool,
    num_splits: int,
    gen: torch.Tensor | None,
) -> list[torch.Tensor]:
    """`_vllm_fa2_C::varlen_fwd` for ragged (non-paged) q, k, v: [out, softmax_lse].

    q [total_q, heads, d], k and v [total_k, kv_heads, d] (same d: vLLM pads v for FA2),
    cu_seqlens_* [batch + 1] int32; out [total_q, heads, d] (written when given), softmax_lse
    [heads, total_q] float32, the log-sum-exp of each row of scale * q k^T. Causal masks align
    to the bottom-right corner (flash_attn_interface.py's docstring). On CUDA the kernel is
    PyTorch's FlashAttention-2; on CPU `_varlen_reference`, per sequence in float32.
    """
    refused = _unsupported_varlen(
        seqused_k=seqused_k is not None,
        leftpad_k=leftpad_k is not None,
        block_table=block_table is not None,
        alibi_slopes=alibi_slopes is not None,
        dropout=p_dropout > 0.0,
        softcap=softcap != 0.0,
        sliding_window=window_size_left >= 0 or window_size_right >= 0,
    )
    if refused:
        raise NotImplementedError(f"varlen_fwd stand-in: {', '.join(refused)} not supported")
    if q.is_cuda:
        result, lse = torch.ops.aten._flash_attention_forward(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            0.0,
            is_causal,
            False,
            scale=softmax_scale,
        )[:2]
        lse = _unpadded_lse(lse, cu_seqlens_q)
    else:
        result, lse = _varlen_reference(
            q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, is_causal
        )
    if out is not None:
        out.copy_(result)
        result = out
    return [result, lse]


def _unpadded_lse(lse: torch.Tensor, cu_seqlens_q: torch.Tensor) -> torch.Tensor:
    """[heads, total_q], whichever layout the kernel wrote ([batch, heads, max_seqlen_q] before
    FlashAttention 2.4 made the varlen log-sum-exp unpadded)."""
    if lse.dim() == 2:
        return lse
    starts = cu_seqlens_q.tolist()
    rows = [lse[b, :, : starts[b + 1] - starts[b]] for b in range(len(starts) - 1)]
    return torch.cat(rows, dim=1)


def _varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention per sequence (float32), the semantics the FlashAttention kernel computes."""
    heads, group = q.shape[1], q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    lse = torch.full((heads, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        q0, q1, k0, k1 = starts_q[b], starts_q[b + 1], starts_k[b], starts_k[b + 1]
        qs = q[q0:q1].float().transpose(0, 1)  # heads, sq, d
        ks = k[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) * scale
        if causal:  # query i sees keys up to i + (sk - sq)
            sq, sk = q1 - q0, k1 - k0
            rows = torch.arange(sq, device=q.device).unsqueeze(1)
            keep = torch.arange(sk, device=q.device).unsqueeze(0) <= rows + (sk - sq)
            scores = scores.masked_fill(~keep, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.nan_to_num(torch.exp(scores - row_lse.unsqueeze(-1)))  # empty rows: 0
        out[q0:q1] = (probs @ vs).transpose(0, 1).to(q.dtype)
        lse[:, q0:q1] = row_lse
    return out, lse


def _varlen_fwd_fake(q: torch.Tensor, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
    out = args[2] if len(args) > 2 else kwargs.get("out")
    result = torch.empty_like(q) if out is None else out
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return [result, lse]


def provide_flash_attn_v2() -> str:
    """Make vLLM's flash_attn_interface see FlashAttention-2 as available.

    It imports the extension module `vllm.vllm_flash_attn._vllm_fa2_C` for its op registrations
    only; the stand-in registers the op, so an empty module in its place is enough. Run after
    `register()` and before vLLM picks its MLA prefill backend.
    """
    import sys
    import types

    name = "vllm.vllm_flash_attn._vllm_fa2_C"
    sys.modules.setdefault(name, types.ModuleType(name))
    interface = sys.modules.get("vllm.vllm_flash_attn.flash_attn_interface")
    if interface is not None:  # imported already, with FA2 found missing
        interface.FA2_AVAILABLE = True
        interface.FA2_UNAVAILABLE_REASON = None
    return name


IMPLS: dict[tuple[str, str], Callable[..., Any]] = {
    ("_moe_C", "topk_softmax"): topk_softmax,
    ("_moe_C", "topk_sigmoid"): topk_sigmoid,
    ("_moe_C", "moe_align_block_size"): moe_align_block_size,
    ("_moe_C", "moe_sum"): moe_sum,
    ("_C_cache_ops", "concat_and_cache_mla"): concat_and_cache_mla,
    ("_C_cache_ops", "gather_and_maybe_dequant_cache"): gather_and_maybe_dequant_cache,
    ("_C", "merge_attn_states"): merge_attn_states,
    ("_vllm_fa2_C", "varlen_fwd"): varlen_fwd,
    ("_C", "dsv3_fused_a_gemm"): dsv3_fused_a_gemm,
}
# Kernels that replace the shim's own: one lacks a form vLLM calls (the grouped norm), one
# allocates what vLLM's kernel does not (the gated activation of the fused-MoE experts).
OVERRIDES: dict[tuple[str, str], Callable[..., Any]] = {
    ("_C", "rms_norm"): rms_norm,
    ("_C", "silu_and_mul"): silu_and_mul,
}
# Ops that return tensors need a fake kernel that makes them; the rest only write into buffers.
FAKES: dict[tuple[str, str], Callable[..., Any]] = {("_vllm_fa2_C", "varlen_fwd"): _varlen_fwd_fake}

# torch.library deregisters what a Library defined when the object is collected: keep them.
_LIBRARIES: dict[str, Library] = {}
_REPLACED: set[tuple[str, str]] = set()


def _library(namespace: str) -> Library:
    if namespace not in _LIBRARIES:
        _LIBRARIES[namespace] = Library(namespace, "FRAGMENT")
    return _LIBRARIES[namespace]


def _has_schema(namespace: str, name: str) -> bool:
    return hasattr(getattr(torch.ops, namespace), name)


def _no_output(*args: Any, **kwargs: Any) -> None:
    """Fake (meta) kernel: these ops only write into buffers the caller passes."""


def _add_fake(qualname: str, lib: Library, fake: Callable[..., Any]) -> None:
    """A fake kernel lets torch.compile trace the op; keep one that exists already."""
    try:
        torch.library.register_fake(qualname, fake, lib=lib)
    except RuntimeError:  # a fake or Meta kernel is registered already
        pass


def register(dispatch_keys: Sequence[str] = ("CUDA", "CPU")) -> list[str]:
    """Define (when missing) and implement every op in IMPLS; return "ns::name" of each.

    An op whose schema already exists (the shim's `_C_cache_ops`) only gets the kernels; a key
    that already has a kernel (a real compiled extension) is left alone, except for the ops in
    OVERRIDES, whose kernel is replaced. Calling it again is a no-op.
    """
    registered = []
    for (namespace, name), kernel in IMPLS.items():
        qualname = f"{namespace}::{name}"
        lib = _library(namespace)
        if not _has_schema(namespace, name):
            lib.define(SCHEMAS[(namespace, name)])
        _add_fake(qualname, lib, FAKES.get((namespace, name), _no_output))
        for key in dispatch_keys:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key):
                lib.impl(name, kernel, key)
        registered.append(qualname)
    for (namespace, name), kernel in OVERRIDES.items():
        qualname = f"{namespace}::{name}"
        lib = _library(namespace)
        if not _has_schema(namespace, name):
            lib.define(SCHEMAS[(namespace, name)])
        _add_fake(qualname, lib, _no_output)
        for key in dispatch_keys:
            if (qualname, key) not in _REPLACED:  # replaces the shim's kernel for that key
                # torch.library refuses a second Python kernel for one key unless the first
                # one's record is dropped; the dispatcher itself takes the newer kernel
                torch.library._impls.discard(f"{namespace}/{name}/{key}")
                lib.impl(name, kernel, key)
                _REPLACED.add((qualname, key))
        registered.append(f"{qualname} (replaced)")
    return registered

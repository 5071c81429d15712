"""Torch stand-ins for what vLLM 0.33.0's DeepSeek sparse-attention (DSA) indexer calls.

Device-harness code (lab tooling, not product). The carried vLLM has no DeepGEMM and no compiled
indexer kernels, and `SparseAttnIndexer` refuses to build without DeepGEMM ("Sparse Attention
Indexer CUDA op requires DeepGEMM support"). `sparse_attn_indexer`
(model_executor/layers/sparse_attn_indexer.py) and its metadata builder
(v1/attention/backends/mla/indexer.py) call, on CUDA:

- `_C_cache_ops.indexer_k_quant_and_cache`: the indexer key's FP8 quantisation into its cache
  (skipped when the fused norm/rope kernel of models/deepseek_v32 writes the cache itself);
- `_C_cache_ops.cp_gather_indexer_k_quant_cache`: prefill reads the cached keys back, flat;
- DeepGEMM's `fp8_fp4_mqa_logits` (prefill) and `fp8_fp4_paged_mqa_logits` (decode, the one in
  the FULL CUDA graphs) through vllm/utils/deep_gemm.py, plus `get_paged_mqa_logits_metadata`;
- `_C_cache_ops.concat_mla_q`: FlashMLA-sparse's `forward_mqa` joins the absorbed query's
  latent and rope parts into its workspace buffer before the attend;
- `_C.top_k_per_row_prefill` / `_C.top_k_per_row_decode` (the decode one when
  kernel_config.sparse_indexer_topk_backend is "per_row"; "auto" picks the compiled
  cooperative/persistent top-k, which the carry lacks too).

FlashMLA's sparse attend (`flash_mla_sparse_fwd`, `_flashmla_C`) has a stand-in too, used only
when asked (`register(sparse_mla=True)`): the wheel ships the kernel itself.

The indexer cache is uint8 [num_blocks, block_size, head_dim + head_dim / 128 * 4]; each block
holds its block_size x head_dim FP8 values first, then block_size fp32 scales (one per 128
values): the layout DeepGEMM's paged kernel reads (`kv_cache[:, :block_size * D]` values, the
rest scales; vLLM's torch reference `fp8_paged_mqa_logits_torch` in
v1/attention/ops/rocm_aiter_mla_sparse.py reads it the same way).

The logits are what memest's owners `indexer_logits_*` name: [query rows x candidate KV
positions]. DeepGEMM returns fp32 on SM90 (the H200) and bf16 on SM100, where vLLM's
`as_fp32_logits` then makes the fp32 copy (both contracts are in vllm/utils/deep_gemm.py's
docstrings). `LOGITS_DTYPE` follows the H200's contract; `register(logits_dtype=torch.bfloat16)`
makes the SM100 pair (bf16 logits and vLLM's fp32 copy) appear on an H200.

Every kernel allocates only its output: the paged (graph-captured) kernel computes through
scratch buffers kept across calls (`_SCRATCH`, sized by a fixed row chunk, allocated at the
first, eager, call: vLLM's warm-up runs precede each capture), so a captured graph's pool holds
the logits and nothing of the stand-in's own. No kernel reads a tensor value on the host or
makes a shape from one, so CUDA-graph capture records them like the CUDA kernels.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.library import Library

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(float8_e4m3fn).max, the CUDA kernel's divisor
LOGITS_DTYPE = torch.float32  # DeepGEMM's MQA logits on SM90
ROW_CHUNK = 64  # requests (decode) or query rows (prefill) per step of the stand-ins' loops

# As vLLM 0.33.0's extensions register them (strings of _C_stable_libtorch.abi3.so; the shim's
# c_schemas.json holds the same), so vLLM's wrappers in vllm/_custom_ops.py bind exactly.
SCHEMAS: dict[tuple[str, str], str] = {
    ("_C_cache_ops", "indexer_k_quant_and_cache"): (
        "indexer_k_quant_and_cache(Tensor k, Tensor! kv_cache, Tensor slot_mapping, "
        "int quant_block_size, str kv_cache_dtype) -> ()"
    ),
    ("_C_cache_ops", "cp_gather_indexer_k_quant_cache"): (
        "cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor! dst_k, Tensor! dst_scale, "
        "Tensor block_table, Tensor cu_seq_lens) -> ()"
    ),
    ("_C_cache_ops", "concat_mla_q"): (
        "concat_mla_q(Tensor ql_nope, Tensor q_pe, Tensor! q_out) -> ()"
    ),
    ("_C", "top_k_per_row_prefill"): (
        "top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, "
        "Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()"
    ),
    ("_C", "top_k_per_row_decode"): (
        "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor! indices, "
        "int numRows, int stride0, int stride1, int topK) -> ()"
    ),
}


# --------------------------------------------------------------------------- cache layout
def cache_regions(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [blocks, block_size, head_dim] uint8, scales [blocks, block_size, groups] fp32)
    of an indexer cache [blocks, block_size(, 1), head_dim + groups * 4] uint8, as views."""
    blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    flat = kv_cache.reshape(blocks, -1) if kv_cache.dim() == 2 else kv_cache.flatten(1)
    split = block_size * head_dim
    values = flat[:, :split].unflatten(1, (block_size, head_dim))
    scales = flat[:, split:].view(torch.float32).unflatten(1, (block_size, -1))
    return values, scales


def _head_dim(kv_cache: torch.Tensor, quant_block_size: int) -> int:
    """head_dim from the entry width: head_dim + head_dim / quant_block_size * 4 bytes."""
    return int(kv_cache.shape[-1] * quant_block_size // (quant_block_size + 4))


# --------------------------------------------------------------------------- cache ops
def indexer_k_quant_and_cache(
    k: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    quant_block_size: int,
    kv_cache_dtype: str,
) -> None:
    """`_C_cache_ops::indexer_k_quant_and_cache`: quantise each token's key into its slot.

    Per group of quant_block_size values: scale = max(amax, 1e-4) / 448, rounded up to a power
    of two when kv_cache_dtype (vLLM passes the scale format) is "ue8m0"; the values k / scale
    in FP8 at slot s = [s // block_size, s % block_size], the scale in the block's scale
    region; slot -1 (padding) writes nothing (csrc/cache_kernels.cu; the Triton port in
    v1/attention/ops/rocm_aiter_mla_sparse.py). Padding rows rewrite slot 0 (block 0, vLLM's
    null block) with its own old value, so nothing depends on tensor values on the host.
    """
    if kv_cache_dtype == "mxfp8":
        raise NotImplementedError("indexer_k_quant_and_cache stand-in: mxfp8 (SM100) scales")
    num_tokens, head_dim = slot_mapping.shape[0], k.shape[-1]
    values, scales = cache_regions(kv_cache, head_dim)
    groups = k[:num_tokens].float().unflatten(-1, (-1, quant_block_size))
    scale = groups.abs().amax(dim=-1).clamp(min=1e-4) / FP8_MAX
    if kv_cache_dtype == "ue8m0":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    quant = (groups / scale.unsqueeze(-1)).flatten(1).to(FP8).view(torch.uint8)
    slots = slot_mapping.long()
    written = slots >= 0
    safe = torch.where(written, slots, 0)
    block, offset = safe // values.shape[1], safe % values.shape[1]
    keep = written.unsqueeze(1)
    values[block, offset] = torch.where(keep, quant, values[block, offset])
    scales[block, offset] = torch.where(keep, scale, scales[block, offset])


def cp_gather_indexer_k_quant_cache(
    kv_cache: torch.Tensor,
    dst_k: torch.Tensor,
    dst_scale: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
) -> None:
    """`_C_cache_ops::cp_gather_indexer_k_quant_cache`: the cached keys of a batch, flat.

    Token t < cu_seq_lens[-1] belongs to sequence b (cu_seq_lens[b] <= t < cu_seq_lens[b + 1])
    at position p = t - cu_seq_lens[b], slot p % block_size of block block_table[b, p //
    block_size]; dst_k[t] gets its head_dim FP8 bytes, dst_scale[t] its 4 scale bytes
    (csrc/cache_kernels.cu; the Triton port in rocm_aiter_mla_sparse.py). Rows past the
    batch keep their contents.
    """
    head_dim = dst_k.shape[-1]
    values, scales = cache_regions(kv_cache, head_dim)
    rows = dst_k.shape[0]
    t = torch.arange(rows, device=dst_k.device)
    cu = cu_seq_lens.long()
    seq = (torch.searchsorted(cu[1:], t, right=True)).clamp(max=cu.numel() - 2)
    valid = t < cu[-1]
    pos = (t - cu[seq]).clamp(min=0)
    block_size = values.shape[1]
    column = (pos // block_size).clamp(max=block_table.shape[1] - 1)
    block = torch.where(valid, block_table.long()[seq, column], 0)
    slot = pos % block_size
    got_k = values[block, slot]
    got_scale = scales[block, slot].view(torch.uint8).reshape(rows, -1)
    dst_k.view(torch.uint8).copy_(torch.where(valid.unsqueeze(1), got_k, dst_k.view(torch.uint8)))
    old_scale = dst_scale.view(torch.uint8).reshape(rows, -1)
    dst_scale.view(torch.uint8).reshape(rows, -1).copy_(
        torch.where(valid.unsqueeze(1), got_scale, old_scale)
    )


CONCAT_NOPE_MULTIPLE = 512  # the CUDA kernel's checks: nope_dim a multiple of 512,
CONCAT_ROPE_DIM = 64  # rope_dim exactly 64


def concat_mla_q(ql_nope: torch.Tensor, q_pe: torch.Tensor, q_out: torch.Tensor) -> None:
    """`_C_cache_ops::concat_mla_q`: q_out[t, h] = cat(ql_nope[t, h], q_pe[t, h]).

    ql_nope [T, H, nope_dim], q_pe [T, H, 64], q_out [>= T, >= H, nope_dim + 64] (vLLM's
    wrapper docstring; csrc/cache_kernels.cu "replaces torch.cat((ql_nope, q_pe), dim=-1)").
    Only the first T tokens and H heads of q_out are written: FlashMLA-sparse with a BF16 cache
    passes its workspace buffer, heads padded to a multiple of 64, and the kernel leaves the
    padding heads as they are. Inputs may be strided (stride 1 in the last dimension, as the
    kernel checks). Writes into q_out only; no host read of tensor values.
    """
    tokens, heads, nope_dim = ql_nope.shape
    rope_dim = q_pe.shape[2]
    if nope_dim % CONCAT_NOPE_MULTIPLE:
        raise RuntimeError(f"nope_dim must be a multiple of 512, got {nope_dim}")
    if rope_dim != CONCAT_ROPE_DIM:
        raise RuntimeError(f"rope_dim must be 64, got {rope_dim}")
    if q_out.shape[2] != nope_dim + rope_dim:
        raise RuntimeError("q_out.size(2) must be nope_dim + rope_dim")
    if ql_nope.stride(2) != 1 or q_pe.stride(2) != 1 or q_out.stride(2) != 1:
        raise RuntimeError("ql_nope, q_pe and q_out must have stride 1 in dim 2")
    if tokens == 0:
        return
    q_out[:tokens, :heads, :nope_dim].copy_(ql_nope)
    q_out[:tokens, :heads, nope_dim:].copy_(q_pe)


# --------------------------------------------------------------------------- top-k
def _topk_rows(
    logits: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    indices: torch.Tensor,
    top_k: int,
) -> None:
    """indices[i, :top_k] = the top_k columns of logits[i] in [starts[i], ends[i]), relative to
    starts[i]; -1 past the row's length. Rows go ROW_CHUNK at a time (bounded temporaries)."""
    width = logits.shape[1]
    k = min(top_k, width)
    cols = torch.arange(width, device=logits.device)
    slots = torch.arange(top_k, device=logits.device)
    for r0 in range(0, logits.shape[0], ROW_CHUNK):
        r1 = min(r0 + ROW_CHUNK, logits.shape[0])
        lo, hi = starts[r0:r1].long().unsqueeze(1), ends[r0:r1].long().unsqueeze(1)
        inside = (cols >= lo) & (cols < hi)
        masked = logits[r0:r1].float().masked_fill(~inside, float("-inf"))
        picked = torch.topk(masked, k, dim=-1).indices - lo
        if k < top_k:
            picked = torch.cat([picked, picked.new_full((r1 - r0, top_k - k), -1)], dim=1)
        real = slots < (hi - lo)  # a row shorter than top_k fills the rest with -1
        indices[r0:r1, :top_k] = torch.where(real, picked, -1).to(indices.dtype)


def top_k_per_row_prefill(
    logits: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    top_k: int,
) -> None:
    """`_C::top_k_per_row_prefill`: per row, the top_k columns in [rowStarts, rowEnds).

    Indices relative to the row start (vLLM localises AITER's absolute ones to match:
    `_localize_aiter_prefill_topk`); -1 where the row is shorter than top_k. The CUDA kernel
    leaves the order within the top-k unspecified; this one sorts by score.
    """
    del stride0, stride1  # the tensor carries its strides
    _topk_rows(logits[:num_rows], row_starts, row_ends, indices, top_k)


def decode_row_ends(seq_lens: torch.Tensor, next_n: int, num_rows: int) -> torch.Tensor:
    """Each decode row's context length: seq_lens [B, next_n] as is; [B] or [B, 1] gives row
    j of request b the length seq_lens[b] - next_n + j + 1 (vLLM's SparseIndexerTopk._row_ends,
    model_executor/layers/indexer_topk.py)."""
    if seq_lens.numel() == num_rows:
        return seq_lens.reshape(-1)
    offsets = torch.arange(next_n, dtype=seq_lens.dtype, device=seq_lens.device)
    ends = seq_lens.reshape(-1, 1) - next_n + 1 + offsets
    return ends.clamp(min=0).reshape(-1)[:num_rows]


def top_k_per_row_decode(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    top_k: int,
) -> None:
    """`_C::top_k_per_row_decode`: the top_k of each decode row's first context-length columns."""
    del stride0, stride1
    ends = decode_row_ends(seq_lens, next_n, num_rows)
    _topk_rows(logits[:num_rows], torch.zeros_like(ends), ends, indices, top_k)


# --------------------------------------------------------------------------- DeepGEMM logits
def fp8_fp4_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    max_seqlen_k: int,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DeepGEMM `fp8_fp4_mqa_logits` (FP8 Q, fp32 K scales): compressed logits [M, max_seqlen_k].

    score(i, n) = sum_h relu(q[i, h] . k[n] * k_scale[n]) * weights[i, h]; row i holds K
    positions [ks[i], ke[i]) from column 0, the tail uncleaned (vllm/utils/deep_gemm.py's
    docstring; vLLM's torch reference `fp8_mqa_logits_torch`). Prefill only (not captured).
    """
    q_values, q_scale = q
    if q_scale is not None:
        raise NotImplementedError("fp8_fp4_mqa_logits stand-in: FP4 / MX-scaled Q (SM100)")
    k_values, k_scales = kv
    rows, width = q_values.shape[0], max_seqlen_k
    logits = torch.empty((rows, width), dtype=logits_dtype or LOGITS_DTYPE, device=q_values.device)
    keys = k_values.float() * k_scales.reshape(-1, 1).float()
    cols = torch.arange(width, device=keys.device)
    for r0 in range(0, rows, ROW_CHUNK):
        r1 = min(r0 + ROW_CHUNK, rows)
        score = torch.einsum("mhd,nd->mhn", q_values[r0:r1].float(), keys).relu_()
        summed = torch.einsum("mhn,mh->mn", score, weights[r0:r1].float())
        at = (cu_seqlen_ks[r0:r1].long().unsqueeze(1) + cols).clamp(max=keys.shape[0] - 1)
        logits[r0:r1] = summed.gather(1, at)
    return logits


_SCRATCH: dict[tuple[str, torch.device, torch.dtype, tuple[int, ...]], torch.Tensor] = {}


def _scratch(
    name: str, device: torch.device, dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    """A buffer kept across calls (allocated once, at the first, eager, call)."""
    key = (name, device, dtype, shape)
    if key not in _SCRATCH:
        _SCRATCH[key] = torch.empty(shape, dtype=dtype, device=device)
    return _SCRATCH[key]


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
    indices: torch.Tensor | None = None,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DeepGEMM `fp8_fp4_paged_mqa_logits` (FP8 Q): logits [B * next_n, max_model_len].

    q [B, next_n, H, D] FP8, kv_cache [blocks, block_size, 1, D + 4] uint8, weights
    [B * next_n, H] fp32. Column c of row (b, j) scores position c of request b:
    sum_h relu(q[b, j, h] . k[c] * scale[c]) * weights[b * next_n + j, h], k read through
    block_tables[b, c // block_size]; columns past the context are not cleaned (the kernel's
    contract, vllm/utils/deep_gemm.py). Every block of the row is scored (a fixed amount of
    work, no host read); the only allocation is the logits.
    """
    q_values, q_scale = q
    if q_scale is not None or indices is not None:
        raise NotImplementedError("fp8_fp4_paged_mqa_logits stand-in: SM100 varlen / FP4 Q")
    del context_lens, schedule_metadata  # columns past the context are left as they come
    batch, next_n, heads, head_dim = q_values.shape
    values, scales = cache_regions(kv_cache, head_dim)
    block_size = values.shape[1]
    dtype = logits_dtype or LOGITS_DTYPE
    logits = torch.empty((batch * next_n, max_model_len), dtype=dtype, device=q_values.device)
    grid = logits.view(batch, next_n, max_model_len)
    dev = q_values.device
    q_f = _scratch("q", dev, torch.float32, (ROW_CHUNK, next_n * heads, head_dim))
    k_u8 = _scratch("k_u8", dev, torch.uint8, (ROW_CHUNK, block_size, head_dim))
    k_f = _scratch("k", dev, torch.float32, (ROW_CHUNK, block_size, head_dim))
    s_f = _scratch("s", dev, torch.float32, (ROW_CHUNK, next_n * heads, block_size))
    red = _scratch("sum", dev, torch.float32, (ROW_CHUNK, next_n, block_size))
    k_s = _scratch("k_scale", dev, torch.float32, (ROW_CHUNK, block_size))
    flat_scales = scales[..., 0]  # one scale per 128 values; the indexer's head_dim is 128
    for b0 in range(0, batch, ROW_CHUNK):
        b1 = min(b0 + ROW_CHUNK, batch)
        n = b1 - b0
        qf = q_f[:n]
        qf.copy_(q_values[b0:b1].reshape(n, next_n * heads, head_dim))
        w = weights[b0 * next_n : b1 * next_n].reshape(n, next_n * heads, 1)
        for column in range(min(-(-max_model_len // block_size), block_tables.shape[1])):
            blk = block_tables[b0:b1, column]
            torch.index_select(values, 0, blk, out=k_u8[:n])
            k_f[:n].copy_(k_u8[:n].view(FP8))
            torch.bmm(qf, k_f[:n].transpose(1, 2), out=s_f[:n])
            s_f[:n].relu_().mul_(w)
            torch.sum(s_f[:n].view(n, next_n, heads, block_size), dim=2, out=red[:n])
            torch.index_select(flat_scales, 0, blk, out=k_s[:n])
            red[:n].mul_(k_s[:n].unsqueeze(1))
            c0 = column * block_size
            c1 = min(c0 + block_size, max_model_len)
            grid[b0:b1, :, c0:c1].copy_(red[:n, :, : c1 - c0])
    return logits


def get_paged_mqa_logits_metadata(
    context_lens: torch.Tensor, block_size: int, num_slots: int, **_: Any
) -> torch.Tensor:
    """DeepGEMM's SM schedule, int32 [num_slots + 1, 2]; the stand-in schedules nothing."""
    return torch.zeros((num_slots + 1, 2), dtype=torch.int32, device=context_lens.device)


# --------------------------------------------------------------------------- sparse MLA
SPARSE_ROW_CHUNK = 16  # query tokens per step of the sparse MLA stand-in (its FP32 scratch)


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA's `flash_mla_sparse_fwd` (vllm/third_party/flashmla/flash_mla_interface.py).

    q [s_q, h_q, d_qk] BF16, kv [s_kv, 1, d_qk] BF16, indices [s_q, 1, topk] int32. Query
    token i attends to the keys indices[i, 0, :topk_length[i]] that are >= 0 and < s_kv (the
    others are masked): p = softmax(sm_scale * q . k) over them, output = p . v with v the first
    d_v values of each key, max_logits the largest scaled score, lse its log-sum-exp. A token with
    no valid key gets output 0 and lse -inf (the empty sum; FlashMLA's own value for that case
    is not checked here). FlashMLA-sparse with a BF16 KV cache runs prefill and decode through
    this one kernel (FlashMLASparseImpl._bf16_flash_mla_kernel).

    Allocates what the kernel returns (output unless ``out`` is given, max_logits, lse); works
    through scratch buffers kept across calls, SPARSE_ROW_CHUNK tokens at a time, and small
    per-chunk row tensors; no host read.
    """
    if attn_sink is not None:
        raise NotImplementedError("flash_mla_sparse_fwd stand-in: attention sinks (DeepSeek-V4)")
    s_q, h_q, d_qk = q.shape
    s_kv, topk, dev = kv.shape[0], indices.shape[-1], q.device
    keys = kv.reshape(s_kv, d_qk)
    output = out if out is not None else q.new_empty((s_q, h_q, d_v))
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=dev)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=dev)
    k_b = _scratch("mla_k", dev, kv.dtype, (SPARSE_ROW_CHUNK * topk, d_qk))
    k_f = _scratch("mla_kf", dev, torch.float32, (SPARSE_ROW_CHUNK, topk, d_qk))
    q_f = _scratch("mla_q", dev, torch.float32, (SPARSE_ROW_CHUNK, h_q, d_qk))
    p_f = _scratch("mla_p", dev, torch.float32, (SPARSE_ROW_CHUNK, h_q, topk))
    o_f = _scratch("mla_o", dev, torch.float32, (SPARSE_ROW_CHUNK, h_q, d_v))
    slots = torch.arange(topk, device=dev)
    for r0 in range(0, s_q, SPARSE_ROW_CHUNK):
        r1 = min(r0 + SPARSE_ROW_CHUNK, s_q)
        n = r1 - r0
        idx = indices[r0:r1].reshape(n, topk).long()
        valid = (idx >= 0) & (idx < s_kv)
        if topk_length is not None:
            valid &= slots < topk_length[r0:r1].long().unsqueeze(1)
        torch.index_select(keys, 0, torch.where(valid, idx, 0).reshape(-1), out=k_b[: n * topk])
        k_f[:n].copy_(k_b[: n * topk].view(n, topk, d_qk))
        q_f[:n].copy_(q[r0:r1])
        scores = p_f[:n]
        torch.bmm(q_f[:n], k_f[:n].transpose(1, 2), out=scores)
        scores.mul_(sm_scale).masked_fill_(~valid.unsqueeze(1), float("-inf"))
        peak = scores.amax(dim=-1)
        max_logits[r0:r1] = peak
        scores.sub_(torch.where(torch.isinf(peak), 0.0, peak).unsqueeze(-1)).exp_()
        total = scores.sum(dim=-1)
        lse[r0:r1] = torch.log(total) + torch.where(torch.isinf(peak), 0.0, peak)
        torch.bmm(scores, k_f[:n, :, :d_v], out=o_f[:n])
        o_f[:n].div_(total.clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(-1))
        output[r0:r1].copy_(o_f[:n])
    return output, max_logits, lse


#: The module that calls FlashMLA's sparse kernel by the name it imported.
SPARSE_MLA_MODULE = "vllm.v1.attention.backends.mla.flashmla_sparse"


def provide_sparse_mla() -> list[str]:
    """FlashMLA-sparse's attend served by the stand-in, where `_flashmla_C` cannot run."""
    import importlib

    module = importlib.import_module(SPARSE_MLA_MODULE)
    module.flash_mla_sparse_fwd = flash_mla_sparse_fwd  # type: ignore[attr-defined]
    return [f"{SPARSE_MLA_MODULE}.flash_mla_sparse_fwd"]


# --------------------------------------------------------------------------- registration
IMPLS: dict[tuple[str, str], Callable[..., Any]] = {
    ("_C_cache_ops", "indexer_k_quant_and_cache"): indexer_k_quant_and_cache,
    ("_C_cache_ops", "cp_gather_indexer_k_quant_cache"): cp_gather_indexer_k_quant_cache,
    ("_C_cache_ops", "concat_mla_q"): concat_mla_q,
    ("_C", "top_k_per_row_prefill"): top_k_per_row_prefill,
    ("_C", "top_k_per_row_decode"): top_k_per_row_decode,
}
# vllm/utils/deep_gemm.py resolves DeepGEMM's symbols into these slots (`_lazy_init`).
DEEP_GEMM_SLOTS: dict[str, Callable[..., Any]] = {
    "_fp8_fp4_mqa_logits_impl": fp8_fp4_mqa_logits,
    "_fp8_fp4_paged_mqa_logits_impl": fp8_fp4_paged_mqa_logits,
    "_get_paged_mqa_logits_metadata_impl": get_paged_mqa_logits_metadata,
}
# The modules whose `has_deep_gemm` gates the indexer (imported by name there).
INDEXER_MODULES = (
    "vllm.model_executor.layers.sparse_attn_indexer",
    "vllm.v1.attention.backends.mla.indexer",
)

_LIBRARIES: dict[str, Library] = {}  # a Library deregisters its ops when collected


def _no_output(*args: Any, **kwargs: Any) -> None:
    """Fake (meta) kernel: these ops only write into buffers the caller passes."""


def register_ops(dispatch_keys: Sequence[str] = ("CUDA", "CPU")) -> list[str]:
    """Define (when missing) and implement the compiled ops; a key with a kernel is left."""
    registered = []
    for (namespace, name), kernel in IMPLS.items():
        qualname = f"{namespace}::{name}"
        lib = _LIBRARIES.setdefault(namespace, Library(namespace, "FRAGMENT"))
        if not hasattr(getattr(torch.ops, namespace), name):
            lib.define(SCHEMAS[(namespace, name)])
        try:
            torch.library.register_fake(qualname, _no_output, lib=lib)
        except RuntimeError:  # a fake or Meta kernel exists already
            pass
        for key in dispatch_keys:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key):
                lib.impl(name, kernel, key)
        registered.append(qualname)
    return registered


def _always() -> bool:
    return True


def provide_deep_gemm_for_indexer(logits_dtype: torch.dtype | None = None) -> list[str]:
    """Make vLLM see DeepGEMM for the sparse indexer only.

    The indexer modules' own `has_deep_gemm` answers True; vllm/utils/deep_gemm.py's slots for
    the MQA logits and their schedule hold the stand-ins, so its wrappers call them without a
    `deep_gemm` import. `vllm.utils.import_utils.has_deep_gemm` is untouched: FP8 GEMMs and
    fused MoE keep their non-DeepGEMM paths. Needs vLLM importable (after `import vllm`).
    """
    import importlib

    if logits_dtype is not None:
        global LOGITS_DTYPE
        LOGITS_DTYPE = logits_dtype
    patched = []
    for name in INDEXER_MODULES:
        module = importlib.import_module(name)
        module.has_deep_gemm = _always  # type: ignore[attr-defined]
        patched.append(f"{name}.has_deep_gemm")
    deep_gemm = importlib.import_module("vllm.utils.deep_gemm")
    for slot, fn in DEEP_GEMM_SLOTS.items():
        setattr(deep_gemm, slot, fn)
        patched.append(f"vllm.utils.deep_gemm.{slot}")
    return patched


#: vLLM's CuTe DSL fused_q, which imports `cutlass` (absent where vLLM runs without its kernels).
FUSED_Q_CUTEDSL_MODULE = "vllm.models.deepseek_v32.nvidia.ops.fused_q_cutedsl"


def _fused_q_cutedsl_unreachable(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("fused_q_cutedsl: the CuTe DSL kernel runs on SM100 only")


def provide_fused_q_without_cute_dsl() -> list[str]:
    """`fused_q` (deepseek_v32/common/kernels.py) imports the CuTe DSL module on every CUDA call
    and asks it whether its kernel applies; on SM90 the answer is no (it needs compute
    capability 10.0) and vLLM's own Triton kernel runs. Where `cutlass` cannot import, a module
    in its place gives that same answer, so the Triton kernel runs as on a full install."""
    import types

    if FUSED_Q_CUTEDSL_MODULE not in sys.modules:
        module = types.ModuleType(FUSED_Q_CUTEDSL_MODULE)
        module.is_fused_q_cutedsl_supported = lambda *a, **k: False  # type: ignore[attr-defined]
        module.fused_q_cutedsl = _fused_q_cutedsl_unreachable  # type: ignore[attr-defined]
        sys.modules[FUSED_Q_CUTEDSL_MODULE] = module
    return [f"{FUSED_Q_CUTEDSL_MODULE} (SM90: Triton fused_q)"]


def register(logits_dtype: torch.dtype | None = None, sparse_mla: bool = False) -> list[str]:
    """The ops, then DeepGEMM for the indexer (vLLM imported already: the shim's schemas), the
    CuTe DSL fused_q's SM90 answer, and with ``sparse_mla`` FlashMLA's sparse attend (for a
    vLLM whose `_flashmla_C` cannot run)."""
    done = register_ops()
    if "vllm" in sys.modules:
        done += provide_deep_gemm_for_indexer(logits_dtype)
        done += provide_fused_q_without_cute_dsl()
        if sparse_mla:
            done += provide_sparse_mla()
    return done

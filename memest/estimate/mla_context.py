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

For any head count (``context_step_requests``, checked by replaying it through the allocator
model, ``replay_context_step``): a step's context is up-projected chunk by chunk, and a later
chunk's kv_nope is allocated while the previous chunk's kv_nope and k are still referenced (the
loop rebinds them only after the new tensors exist); only FA2's padded v of the previous chunk is
free by then. A second chunk of r rows therefore takes one more kv_nope segment when r x (nope + v)
exceeds the freed padded v, W x (nope + rope) (FA2: r > 3/4 W for DeepSeek's dims), and always
with FA3 (nothing of the previous chunk is free), unless an older free block fits it. The term
holds one full chunk, the measured case; ``second_chunk_bytes`` is what a step whose context
fills two chunks reserves beyond it (the pre-flight states it as uncertainty).

DeepSeek sparse attention (DSA: an indexer picks ``index_topk`` positions per query; vLLM
0.33.0's sparse MLA backends, FLASHMLA_SPARSE on SM90) prefills two ways
(model_executor/layers/attention/sparse_mla_attention.py, models/deepseek_v32/attention.py):

- dense MHA when the longest prefill sequence of the step fits the top-k
  (``_use_dense_mha_prefill``: prefill_max_seq_len <= index_topk): ``MLACommonBaseImpl.forward_mha``,
  the same step up-projection and cached-context chunks as above. Every prefill then holds at
  most index_topk - 1 cached tokens (one new token at least) and a step at most
  min(max_num_seqs, max_num_batched_tokens) prefills, so a chunk holds at most that many times
  index_topk - 1 rows, and at most the sparse builder's workspace
  (``SparseMLACommonMetadataBuilder.determine_chunked_prefill_workspace_size``: the dense rule,
  also capped at max_num_seqs x index_topk, not block-aligned without DCP; whole contexts pack
  up to it in ``plan_mla_context_chunks``). Which requests are prefills: FlashMLA-sparse
  requires uniform decodes (``split_decodes_and_prefills``), so a batch of requests with one
  query length of at most its reorder threshold (256 tokens at 128 heads on SM90) is all
  decodes, the sparse attend below; a request whose query length differs from the first one's
  is a prefill however short, so a full chunk is reachable with max_num_seqs requests over
  cached prefixes of up to index_topk - 1 tokens. Measured on an H200 (reports/vllm, calls
  41-42, DeepSeek-V3.2's shape): 16 and 17 prefills over 1,984 cached tokens each, with query
  lengths that all differ (vLLM's batch reorder may put any of them first), up-projected
  chunks of 31,744 and 32,640 rows; the second start ended 0.051 GiB over memest's budget.
- otherwise the sparse attend over the top-k positions (``forward_mqa`` ->
  ``FlashMLASparseImpl._forward_bf16_kv``): nothing is up-projected; it reads the KV cache's rows
  in place (BF16 cache; an FP8 cache is up-converted into a workspace reserved at init) and
  allocates per query row the physical top-k ([rows, index_topk] int32 and a count per row,
  ``triton_convert_req_index_to_global_index``), the kernel's output [rows, heads padded to 64,
  kv_lora_rank] and its max-logits and LSE [rows, padded heads] float32. The indexer's prefill
  logits stay within VLLM_SPARSE_INDEXER_MAX_LOGITS_MB per chunk, which the profile run
  reserves itself (memest.estimate.indexer sizes them).

The DSA term is the larger of the two (``dsa_context_bytes``). vLLM's profile run allocates no
context stand-in for DSA layers (``DeepseekV32Attention._sparse_indexer_and_attn`` returns before
``MLAAttention.forward_impl`` without attention metadata), so nothing is subtracted.
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.errors import ConfigError
from memest.estimate.activation import sampler_reserve
from memest.estimate.allocsim import PoolSim, round_size, segment_size
from memest.estimate.model_shape import ModelShape, model_shape
from memest.schema import RunConfig

#: vLLM 0.33.0 MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size: room for 8
#: full-length requests or at least 4 pages per request, capped at 64k tokens.
WORKSPACE_MAX_MODEL_LENS = 8
WORKSPACE_PAGES_PER_SEQ = 4
WORKSPACE_CAP_TOKENS = 64 * 1024
#: The softmax LSE FlashAttention returns for a chunk or for new tokens over context: float32.
LSE_BYTES = 4
#: vLLM 0.33.0 FlashMLASparseImpl.prefill_padding: the sparse kernel's heads, a multiple of 64.
SPARSE_HEAD_PADDING = 64
#: The sparse attend's physical top-k indices and per-row counts: int32.
INDEX_BYTES = 4


def chunked_prefill_workspace_tokens(
    max_model_len: int, max_num_seqs: int, block_size: int, index_topk: int = 0
) -> int:
    """Tokens of context MLA up-projects at once (one chunk).

    align_mla_chunked_context_workspace_size rounds the rule's tokens up to a whole KV block
    (without decode context parallelism), and the context chunks are cut on block boundaries.
    Sparse MLA (a DSA model's ``index_topk``; sparse_mla_attention.py
    determine_chunked_prefill_workspace_size) also caps them at max_num_seqs x index_topk and,
    without decode context parallelism, does not round.
    """
    wanted = max(
        WORKSPACE_MAX_MODEL_LENS * max_model_len,
        WORKSPACE_PAGES_PER_SEQ * max_num_seqs * block_size,
    )
    if index_topk:
        return max(min(wanted, WORKSPACE_CAP_TOKENS, max_num_seqs * index_topk), block_size)
    tokens = max(min(wanted, WORKSPACE_CAP_TOKENS), block_size)
    return -(-tokens // block_size) * block_size


def _rounded(nbytes: int) -> int:
    """Bytes of the segment a request that finds no free block reserves (allocsim's rules)."""
    return segment_size(round_size(nbytes))


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


#: One request of a replayed sequence: ("alloc", name, bytes) or ("free", name, 0).
Request = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class ContextReplay:
    """What the allocator model reserved for a step's prefill and then for its context chunks."""

    step_bytes: int
    context_bytes: int
    context_segments: tuple[int, ...]


def step_requests(shape: ModelShape, tokens: int, *, v_padded: bool) -> list[Request]:
    """The step's up-projected tensors, live together at the prefill call, then freed.

    kv_nope, k and (FA2) padded v as measured in call 19: the attention output, of k's size
    under FA2, took a segment and k a block the compiled pieces had freed.
    """
    tensors = up_projection_tensors(shape, tokens, v_padded=v_padded)
    return [("alloc", f"step.{n}", b) for n, b in tensors.items()] + [
        ("free", f"step.{n}", 0) for n in tensors
    ]


def context_step_requests(
    shape: ModelShape, chunks: list[int], *, v_padded: bool, query_tokens: int = 0
) -> list[Request]:
    """``_compute_prefill_context``'s requests, one context chunk of ``chunks[i]`` rows after
    another (vLLM 0.33.0, no decode context parallelism).

    Per chunk: kv_b_proj's output kv_nope; the previous chunk's kv_nope is freed once
    ``kv_nope.split`` rebinds its views, then k (``_concat_k_nope_k_pe``) and the previous k
    freed when k is rebound; FA2 pads v and frees it when the kernel returns; the chunk's
    attention output [query tokens, heads, qk or v] and float32 LSE stay until the next chunk's
    are merged. The chunked-prefill workspace the context is gathered into is persistent.
    """
    qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    out_dim = qk if v_padded else shape.v_head_dim
    requests: list[Request] = []
    for i, rows in enumerate(chunks):
        tensors = up_projection_tensors(shape, rows, v_padded=v_padded)
        requests.append(("alloc", f"kv_nope.{i}", tensors["kv_nope"]))
        if i:
            requests.append(("free", f"kv_nope.{i - 1}", 0))
        requests.append(("alloc", f"k.{i}", tensors["k"]))
        if i:
            requests.append(("free", f"k.{i - 1}", 0))
        if v_padded:
            requests.append(("alloc", f"v_padded.{i}", tensors["v_padded"]))
        if query_tokens:
            rows_q = query_tokens * shape.heads
            requests.append(("alloc", f"out.{i}", rows_q * out_dim * shape.dtype_bytes))
            requests.append(("alloc", f"lse.{i}", rows_q * LSE_BYTES))
        if v_padded:
            requests.append(("free", f"v_padded.{i}", 0))
        if query_tokens and i:
            requests += [("free", f"out.{i - 1}", 0), ("free", f"lse.{i - 1}", 0)]
    return requests


def _feed(sim: PoolSim, requests: list[Request], handles: dict[str, int]) -> None:
    for kind, name, nbytes in requests:
        if kind == "alloc":
            handles[name] = len(handles) + 1
            sim.alloc(handles[name], nbytes, 0)
        else:
            sim.free(handles[name])


def replay_context_step(
    shape: ModelShape,
    step_tokens: int,
    chunks: list[int],
    *,
    v_padded: bool,
    query_tokens: int = 0,
) -> ContextReplay:
    """The step's, then the context chunks' requests through the allocator model (memest.
    estimate.allocsim) from an empty pool: the segments each adds (the chunks may reuse the
    step's freed blocks, as in serving, where the first full-size step comes first)."""
    sim, handles = PoolSim(), dict[str, int]()
    _feed(sim, step_requests(shape, step_tokens, v_padded=v_padded), handles)
    step = sim.result()
    _feed(
        sim,
        context_step_requests(shape, chunks, v_padded=v_padded, query_tokens=query_tokens),
        handles,
    )
    context = sim.result().segments[len(step.segments) :]
    return ContextReplay(step.reserved_bytes, sum(context), tuple(context))


def second_chunk_bytes(
    shape: ModelShape, workspace_tokens: int, step_tokens: int, *, v_padded: bool
) -> int:
    """What a step whose context fills two whole chunks reserves beyond one (0 without MLA)."""
    if shape.family != "mla" or workspace_tokens <= 0:
        return 0
    one = replay_context_step(shape, step_tokens, [workspace_tokens], v_padded=v_padded)
    two = replay_context_step(shape, step_tokens, [workspace_tokens] * 2, v_padded=v_padded)
    return two.context_bytes - one.context_bytes


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
    The step's tensors and one whole chunk's, replayed (``replay_context_step``).
    """
    if shape.family != "mla":
        return 0
    chunks = [workspace_tokens] if workspace_tokens > 0 else []
    replay = replay_context_step(shape, step_tokens, chunks, v_padded=v_padded)
    held = profile_standin_bytes(shape, workspace_tokens) if standin_in_headroom else 0
    return replay.step_bytes + replay.context_bytes - held


def sparse_context_chunk_rows(
    workspace_tokens: int, max_num_seqs: int, max_num_batched_tokens: int, index_topk: int
) -> int:
    """Most cached-context rows one dense-MHA chunk up-projects under a sparse MLA backend:
    min(max_num_seqs, max_num_batched_tokens) prefills of at most index_topk - 1 cached tokens
    each, at most the workspace."""
    prefills = min(max_num_seqs, max_num_batched_tokens)
    return max(min(workspace_tokens, prefills * (index_topk - 1)), 0)


def sparse_attend_tensors(shape: ModelShape, tokens: int, index_topk: int) -> dict[str, int]:
    """Bytes of what FlashMLA-sparse's attend over the top-k allocates for ``tokens`` query rows
    (``_forward_bf16_kv``, per rank; 0 rows or no MLA: nothing)."""
    if shape.family != "mla" or tokens <= 0:
        return {}
    heads = -(-shape.heads // SPARSE_HEAD_PADDING) * SPARSE_HEAD_PADDING
    return {
        "topk": tokens * index_topk * INDEX_BYTES,
        "topk_length": tokens * INDEX_BYTES,
        "out": tokens * heads * shape.kv_lora_rank * shape.dtype_bytes,
        "max_logits": tokens * heads * LSE_BYTES,
        "lse": tokens * heads * LSE_BYTES,
    }


def sparse_attend_bytes(shape: ModelShape, tokens: int, index_topk: int) -> int:
    """What the sparse attend's tensors reserve from an empty pool (allocsim), live together."""
    tensors = sparse_attend_tensors(shape, tokens, index_topk)
    requests: list[Request] = [("alloc", n, b) for n, b in tensors.items()]
    sim, handles = PoolSim(), dict[str, int]()
    _feed(sim, requests + [("free", n, 0) for n in tensors], handles)
    return sim.result().reserved_bytes


def dsa_context_bytes(
    shape: ModelShape, chunk_rows: int, step_tokens: int, index_topk: int, *, v_padded: bool
) -> int:
    """Reservation a DSA model's prefill needs beyond the activation headroom (0 without MLA).

    The larger of the dense-MHA prefill (the step's up-projection, then one chunk of
    ``chunk_rows`` cached-context rows, ``replay_context_step``) and the sparse attend over the
    top-k of a full step of ``step_tokens`` rows; no profile stand-in is subtracted (DSA layers
    allocate none).
    """
    if shape.family != "mla":
        return 0
    chunks = [chunk_rows] if chunk_rows > 0 else []
    dense = replay_context_step(shape, step_tokens, chunks, v_padded=v_padded)
    sparse = sparse_attend_bytes(shape, step_tokens, index_topk)
    return max(dense.step_bytes + dense.context_bytes, sparse)


def context_term_bytes(
    shape: ModelShape,
    max_model_len: int,
    max_num_seqs: int,
    block_size: int,
    step_tokens: int,
    *,
    v_padded: bool,
    standin_in_headroom: bool = True,
) -> int:
    """The prefill-over-context term of one grid: ``dsa_context_bytes`` for a DSA model (its
    ``index_topk``), else ``mla_context_bytes``; 0 without MLA. The one entry the plugin's
    estimate, the what-if and the pre-flight share.

    The activation headroom holds the full-batch sampler's reserve (memest.estimate.sampler),
    which belongs to the batch step, not to this prefill: the two steps' transients combine by
    max, so the term is what the prefill needs beyond that reserve.
    """
    if shape.family != "mla":
        return 0
    topk = shape.index_topk
    workspace = chunked_prefill_workspace_tokens(max_model_len, max_num_seqs, block_size, topk)
    if topk:
        rows = sparse_context_chunk_rows(workspace, max_num_seqs, step_tokens, topk)
        term = dsa_context_bytes(shape, rows, step_tokens, topk, v_padded=v_padded)
    else:
        term = mla_context_bytes(
            shape,
            workspace,
            step_tokens,
            v_padded=v_padded,
            standin_in_headroom=standin_in_headroom,
        )
    return max(term - sampler_reserve(shape, max_num_seqs, step_tokens), 0)


def run_mla_context_bytes(config: RunConfig, block_size: int) -> int:
    """The term for one start from its configuration (0 without MLA or a dimension it needs).

    The model's recorded dimensions give the shape per rank; the prefill backend's padding of v
    is the recorded one, else assumed (FlashAttention 2 pads: the larger reservation). The
    headroom holds the profile run's stand-in unless memest's warm pass recorded running without.
    A model with recorded indexer dimensions (DSA) takes ``dsa_context_bytes``; a report written
    before those were recorded keeps the dense term.
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
    padded = True if config.mla_prefill_v_padded is None else config.mla_prefill_v_padded
    return context_term_bytes(
        shape,
        config.max_model_len,
        config.max_num_seqs or 1,
        block_size,
        config.max_num_batched_tokens or 0,
        v_padded=padded,
        standin_in_headroom=not config.mla_warm_pass_without_standin,
    )

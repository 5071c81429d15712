"""What a DeepSeek sparse attention (DSA) model adds to the pre-flight, from vLLM 0.33.0's code.

A config with ``index_topk`` (DeepseekV32ForCausalLM) runs sparse MLA with an indexer in every
layer. Beside the MLA terms the pre-flight already has:

- KV cache: each layer's indexer key cache, index_head_dim FP8 values and a float32 scale per 128
  of them per token (memest.estimate.kv), in blocks of 64 tokens (memest.preflight.backends);
- weights: the indexer's wq_b, wk_weights_proj and k_norm (memest.estimate.terms.shape);
- graph pools: every FULL graph's decode logits, tokens x max_model_len per layer, FP32 on SM90,
  BF16 plus vLLM's FP32 copy on SM100 (memest.estimate.synthetic_trace with
  memest.estimate.indexer's law);
- activation: the profile run's stand-in for a prefill's logits, VLLM_SPARSE_INDEXER_MAX_LOGITS_MB
  (the bound vLLM's prefill chunker keeps every chunk's FP32 logits within);
- profiling residue: the workspace the profile run leaves in vLLM's workspace manager (the
  indexer's K gather, FLASHMLA_SPARSE's q_concat), beyond the fused-MoE workspace it shares;
- weights: also the [max_num_batched_tokens, index_topk] int32 top-k buffer the model allocates
  (memest.estimate.runner_buffers).
"""

from __future__ import annotations

from collections.abc import Mapping

from memest.errors import ConfigError
from memest.estimate.indexer import (
    FP32_BYTES,
    IndexerLogits,
    indexer_logits,
    prefill_workspace_bytes,
    profile_logits_bytes,
)
from memest.estimate.model_shape import ModelShape
from memest.estimate.synthetic_trace import GraphPoolPrediction, IndexerDecode
from memest.schema import CapturePlan

INDEXER_OWNERS = "indexer_logits"


def check_kv_dtype(kv_cache_dtype: str | None) -> None:
    """A DSA model's latent cache in the model's dtype only: vLLM 0.33.0 stores an FP8 one as
    fp8_ds_mla (656 B per token: values, scales and a BF16 rope part), not modelled here.

    Raises:
        ConfigError: any other --kv-cache-dtype.
    """
    if kv_cache_dtype not in (None, "auto", "bfloat16"):
        raise ConfigError(
            "kv_cache_dtype",
            kv_cache_dtype,
            "a sparse-MLA (DSA) model's FP8 cache is vLLM's fp8_ds_mla layout, which memest "
            "does not size; use auto or bfloat16",
        )


def indexer_pool_bytes(pools: GraphPoolPrediction) -> int:
    """The DSA indexer logits' share of the replayed graph pools (owners indexer_logits_*)."""
    return sum(
        b
        for (_, owner), b in pools.replay.bytes_by_owner.items()
        if owner.startswith(INDEXER_OWNERS)
    )


def full_graph_logits(plan: CapturePlan, indexer: IndexerDecode) -> list[IndexerLogits]:
    """One layer's decode logits in each FULL target graph of ``plan``, widest first."""
    out = []
    for row in plan.runners:
        if row.runner.startswith("target") and row.graph_mode == "FULL":
            for size in sorted(row.sizes, reverse=True):
                tokens = size * row.q if row.unit == "requests" else size
                out.append(indexer_logits(tokens, indexer.positions, indexer.kernel_element_bytes))
    return out


def requested_bytes(plan: CapturePlan, shape: ModelShape, indexer: IndexerDecode) -> int:
    """What every FULL graph's indexer calls request, summed over the graphs and the layers
    (each call's logits are freed before the next: the pool holds far less)."""
    return shape.num_layers * sum(x.total_bytes for x in full_graph_logits(plan, indexer))


def pool_range(plan: CapturePlan, indexer: IndexerDecode, pools: GraphPoolPrediction) -> int:
    """The graph-pool term's range for the indexer: its replayed share, or at least one widest
    graph's logits (which a segment of their own would hold)."""
    widest = max((x.total_bytes for x in full_graph_logits(plan, indexer)), default=0)
    return max(indexer_pool_bytes(pools), widest)


def pool_law(
    plan: CapturePlan, shape: ModelShape, indexer: IndexerDecode | None, pools: GraphPoolPrediction
) -> str:
    """The graph-pool law's words for the indexer's share ("" without an indexer)."""
    if indexer is None:
        return ""
    element = "FP32" if indexer.kernel_element_bytes == FP32_BYTES else "BF16 + the FP32 copy"
    graphs = len(full_graph_logits(plan, indexer))
    return (
        f"; of it the DSA indexer's decode logits {indexer_pool_bytes(pools)} B (tokens x "
        f"max_model_len {indexer.positions} x {element}: {requested_bytes(plan, shape, indexer)}"
        f" B requested over {graphs} FULL graphs x {shape.num_layers} layers, freed per layer)"
    )


def activation_bytes(shape: ModelShape) -> int:
    """The profile run's indexer logits stand-in (0 without an indexer)."""
    return profile_logits_bytes() if shape.sparse else 0


#: FlashMLASparseImpl's prefill head padding (bf16 cache: q_concat's heads rounded up to it).
FLASHMLA_SPARSE_HEAD_PADDING = 64
WORKSPACE_ELEMENT_BYTES = 2  # q_concat is BF16


def workspace_bytes(shape: ModelShape, mbt: int, max_model_len: int, backend: str) -> int:
    """vLLM's workspace-manager buffer of a DSA model: the largest request of its callers, the
    indexer's profile gather (memest.estimate.indexer) and, for FLASHMLA_SPARSE with a BF16
    cache, q_concat ([max_num_batched_tokens, heads rounded up to 64, 576] BF16,
    flashmla_sparse.py). FLASH_ATTN_MLA_SPARSE asks for none."""
    if not shape.sparse:
        return 0
    sizes = [prefill_workspace_bytes(max_model_len, shape.index_head_dim)]
    if backend == "FLASHMLA_SPARSE":
        pad = FLASHMLA_SPARSE_HEAD_PADDING
        heads = -(-shape.heads // pad) * pad
        sizes.append(mbt * heads * shape.kv * WORKSPACE_ELEMENT_BYTES)
    return max(sizes)


def residue_bytes(
    shape: ModelShape, mbt: int, max_model_len: int, backend: str, buffers: Mapping[str, int]
) -> int:
    """What the workspace adds to the profiling residue beyond the fused-MoE workspace (in
    ``buffers``, memest.estimate.runner_buffers'), which shares the manager's one buffer (0
    without an indexer)."""
    fused_moe = buffers.get("fused_moe_workspace", 0)
    return max(workspace_bytes(shape, mbt, max_model_len, backend) - fused_moe, 0)


ACTIVATION_LAW = (
    " + the DSA indexer's prefill logits bound (VLLM_SPARSE_INDEXER_MAX_LOGITS_MB, "
    f"{profile_logits_bytes()} B)"
)
RESIDUE_LAW = (
    " + the DSA workspace (the indexer's K gather; FLASHMLA_SPARSE's q_concat) beyond any "
    "fused-MoE workspace"
)


def note(shape: ModelShape, pool_share: int) -> str:
    """What the pre-flight derived for a DSA model and what its range holds."""
    return (
        f"DSA (index_topk {shape.index_topk}, {shape.index_n_heads} indexer heads of "
        f"{shape.index_head_dim}): the indexer's key cache, weights, decode logits in every FULL "
        f"graph ({pool_share} B of the graph pool) and the profile run's prefill logits bound are "
        "derived from vLLM 0.33.0's code, not measured; the graph-pool range holds that share or "
        "at least one widest graph's logits (SM100's DeepSelect top-k drops the FP32 copy; "
        "chunked decode logits are a later vLLM's)"
    )

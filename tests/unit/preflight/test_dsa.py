"""The pre-flight of a DeepSeek sparse attention (DSA) model: lab/models/dsv32_4l at the lab grid.

Expected values are worked by hand from vLLM 0.33.0's code:

- backends: on SM90 sparse MLA takes FLASH_ATTN_MLA_SPARSE, FLASHMLA_SPARSE or
  FLASHINFER_MLA_SPARSE_SM90 (platforms/cuda.py ``_get_backend_priorities``), each with kernel
  blocks ``MultipleOf(64)``; ``get_preferred_block_size(16)`` gives 64 (16 is no multiple of 64);
- the indexer's key cache: DeepseekV32Indexer's cache holds head_dim + head_dim // 128 x 4 =
  128 + 4 = 132 uint8 per token and layer, beside MLA's latent (512 + 64) x 2 B = 1,152;
- decode logits: ``fp8_fp4_paged_mqa_logits`` returns [B x next_n, max_model_len], FP32 on SM90;
  the lab start (S_dsv32_4l_s64_t2048: 64 sequences, 2,048 batched tokens, max_model_len 4,096,
  no drafter) captures FULL decode graphs of 1, 2, 4, 8, 16, 24, ..., 64 requests (the capture
  sizes up to max_num_seqs), each calling the indexer once per layer (4 layers);
- the profile run's ``sparse_attn_indexer`` reserves VLLM_SPARSE_INDEXER_MAX_LOGITS_MB = 512 MiB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memest.errors import ConfigError
from memest.estimate.synthetic_trace import synthetic_trace
from memest.estimate.terms.dsa import indexer_pool_bytes
from memest.estimate.terms.shape import model_shape, parameter_bytes
from memest.preflight.backends import kv_block_size
from memest.preflight.predict import preflight, request_from, setup

ROOT = Path(__file__).resolve().parents[3]
DSV32 = json.loads((ROOT / "lab/models/dsv32_4l/config.json").read_text())
MiB = 1 << 20
#: The FULL decode request counts of 64 sequences without a drafter (vLLM's capture sizes 1, 2,
#: 4, then every 8, kept up to max_num_seqs).
FULL_SIZES = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
LAYERS = 4


def _request(**extra: Any) -> Any:
    fields = {
        "model_config_json": DSV32,
        "gpu": "h200",
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.85,
        **extra,
    }
    return request_from(fields)


def test_the_lab_grid_is_the_lab_starts() -> None:
    from lab.vllm_runs import CONFIGS, MAX_MODEL_LEN

    cfg = CONFIGS["S_dsv32_4l_s64_t2048"]
    assert (cfg["max_num_seqs"], cfg["mbt"], MAX_MODEL_LEN) == (64, 2048, 4096)
    assert cfg["attention_backend"] == "FLASHMLA_SPARSE"


def test_shape_reads_the_indexer() -> None:
    s = model_shape(DSV32)
    assert (s.index_n_heads, s.index_head_dim, s.index_topk, s.sparse) == (64, 128, 2048, True)
    assert not model_shape({**DSV32, "index_topk": None}).sparse


def test_parameter_bytes_hold_the_indexer() -> None:
    """test_dsa_vllm.py's hand sum of vLLM's parameters of this model (8,486,275,072 B: per
    layer wq_b 1,536 x 64 x 128 and wk_weights_proj 7,168 x (128 + 64) in BF16, k_norm's weight
    and bias 2 x 128 in FP32), plus the rotary cos/sin cache memest counts with the weights:
    163,840 positions x 64 x 2 B."""
    assert parameter_bytes(model_shape(DSV32)) == 8_486_275_072 + 163_840 * 64 * 2
    without = {k: v for k, v in DSV32.items() if not k.startswith("index_")}
    indexer = 1536 * 64 * 128 * 2 + 7168 * 192 * 2 + 2 * 128 * 4
    assert parameter_bytes(model_shape(DSV32)) - parameter_bytes(model_shape(without)) == (
        LAYERS * indexer
    )


def test_sparse_backends_and_block_size() -> None:
    assert kv_block_size(mla=True, sm100=False, sparse=True) == (64, "FLASH_ATTN_MLA_SPARSE")
    assert kv_block_size(mla=True, sm100=False, sparse=True, backend="flashmla_sparse") == (
        64,
        "FLASHMLA_SPARSE",
    )
    # SM100 above 16 heads: FlashMLA first; at 16 or fewer FlashAttention 4
    assert kv_block_size(mla=True, sm100=True, sparse=True) == (64, "FLASHMLA_SPARSE")
    assert kv_block_size(mla=True, sm100=True, sparse=True, heads=16) == (
        64,
        "FLASH_ATTN_MLA_SPARSE_FA4",
    )
    with pytest.raises(ConfigError, match="not a sparse MLA"):
        kv_block_size(mla=True, sm100=False, sparse=True, backend="TRITON_MLA")
    with pytest.raises(ConfigError, match="no attention backend takes it"):
        kv_block_size(mla=True, sm100=False, sparse=True, block_size=16)


def test_preflight_of_the_lab_start() -> None:
    req = _request(attention_backend="FLASHMLA_SPARSE")
    result = preflight(req)
    assert (result.attention_backend, result.block_size) == ("FLASHMLA_SPARSE", 64)
    # 4 layers x (latent 1,152 + indexer 132)
    assert result.kv_bytes_per_token == 4 * (1152 + 132) == 5136
    assert result.kv_cache.extra["indexer_head_dim"] == 128
    assert result.kv_cache.extra["indexer_scale_bytes"] == 4
    terms = {t.name: t for t in result.term_details}
    assert "DSA indexer's prefill logits bound" in terms["profile_peak_activation_bytes"].law
    assert "536870912 B" in terms["profile_peak_activation_bytes"].law
    # the sum over the FULL sizes (test_the_indexer_requests_of_every_full_graph), and the
    # replayed share: 0 B at 4,096 positions (test_the_indexer_pool_share)
    assert (
        "the DSA indexer's decode logits 0 B (tokens x max_model_len 4096 x FP32: 19333120 B "
        "requested over 11 FULL graphs x 4 layers" in terms["graph_pool_bytes"].law
    )
    assert any(n.startswith("DSA (index_topk 2048") for n in result.notes)
    assert not result.measured_family


def test_the_indexer_requests_of_every_full_graph() -> None:
    """Every FULL graph holds, per layer, one FP32 [tokens, 4,096] tensor: 1 + 2 + 4 + 8 + 16 +
    24 + ... + 64 = 295 rows over the 11 graphs, x 4 layers x 4,096 x 4 B = 19,333,120 B."""
    s = setup(_request())
    assert [r.sizes for r in s.plan.runners if r.runner == "target.full"] == [FULL_SIZES]
    trace = synthetic_trace(s.plan, s.target, indexer=s.indexer)
    per_graph = {
        g.size: [a.size for a in g.allocs if a.owner.startswith("indexer_logits")]
        for g in trace.stages["target.full"]
    }
    assert per_graph == {n: [n * 4096 * 4] * LAYERS for n in FULL_SIZES}
    assert sum(map(sum, per_graph.values())) == sum(FULL_SIZES) * LAYERS * 4096 * 4 == 19_333_120
    assert not any(
        a.owner.startswith("indexer_logits")
        for g in trace.stages["target.piecewise"]
        for a in g.allocs
    )


def test_the_indexer_pool_share() -> None:
    """At max_model_len 4,096 the widest graph's logits are 64 x 4,096 x 4 = 1 MiB, a small-pool
    request that the blocks the PIECEWISE graphs freed hold: no growth of their own. At the
    config's 163,840 positions they are 64 x 163,840 x 4 = 40 MiB, above every block the
    PIECEWISE graphs left: one 40 MiB segment, which every narrower graph's logits reuse."""
    assert indexer_pool_bytes(setup(_request()).pools()) == 0
    wide = setup(_request(max_model_len=163840))
    assert indexer_pool_bytes(wide.pools()) == 64 * 163840 * 4 == 40 * MiB
    owners = {o for (_, o) in wide.pools().replay.bytes_by_owner}
    assert "indexer_logits_fp32_kernel" in owners


def test_sm100_writes_the_bf16_and_fp32_pair() -> None:
    s = setup(_request(gpu="gb200"))
    trace = synthetic_trace(s.plan, s.target, indexer=s.indexer)
    widest = max(trace.stages["target.full"], key=lambda g: g.size)
    pair = [(a.owner, a.size) for a in widest.allocs if a.owner.startswith("indexer")]
    rows = widest.size  # no drafter: one token per request
    assert pair[:2] == [
        ("indexer_logits_bf16", rows * 4096 * 2),
        ("indexer_logits_fp32", rows * 4096 * 4),
    ]


def test_the_uncertainty_widens_for_the_unmeasured_family() -> None:
    """No DSA start in the calibration: the prior widening, and the graph pool's range holds one
    widest graph's logits beside it (64 x 4,096 x 4 = 1 MiB; at 163,840 positions the replayed
    40 MiB share)."""
    without = {k: v for k, v in DSV32.items() if not k.startswith("index_")}
    dense_mla = preflight(_request(model_config_json=without))
    result = preflight(_request())
    pool = next(t for t in result.term_details if t.name == "graph_pool_bytes")
    before = next(t for t in dense_mla.term_details if t.name == "graph_pool_bytes")
    activation = next(t for t in result.term_details if t.name == "profile_peak_activation_bytes")
    assert activation.uncertainty_bytes > activation.bytes // 10
    assert any("has no measured start" in n for n in result.notes)
    # same pool (the logits fit freed blocks), one widest graph's logits more range
    assert pool.bytes == before.bytes
    assert pool.uncertainty_bytes - before.uncertainty_bytes == 64 * 4096 * 4


def test_fp8_kv_of_a_dsa_model_is_refused() -> None:
    with pytest.raises(ConfigError, match="fp8_ds_mla"):
        setup(_request(kv_cache_dtype="fp8"))


def test_grid_sized_buffers_and_the_workspace() -> None:
    """The model's top-k index buffer, [2,048 batched tokens, top-2,048] int32 = 16 MiB, with the
    weights; vLLM's workspace manager holds one buffer, the largest request of its callers:
    the profile run's indexer gather of 4,096 x (1,152 // 132 = 8) x factor 5 = 163,840 keys
    (128 FP8 values = 20,971,520 B, a 4-byte scale each = 655,360 B) plus the radix top-k's
    1 MiB = 22,675,456 B; FLASHMLA_SPARSE's q_concat is larger, 2,048 tokens x 128 heads (a
    multiple of 64) x 576 x 2 B = 301,989,888 B. FLASH_ATTN_MLA_SPARSE asks for none."""
    without = {k: v for k, v in DSV32.items() if not k.startswith("index_")}

    def residue(**extra: Any) -> int:
        terms = {t.name: t.bytes for t in preflight(_request(**extra)).term_details}
        return terms["profiling_residue_bytes"]

    def weights(**extra: Any) -> int:
        terms = {t.name: t.bytes for t in preflight(_request(**extra)).term_details}
        return terms["weights_bytes"]

    gather = 163840 * 128 + 163840 * 4 + 1024 * 1024
    assert gather == 22_675_456
    assert residue() - residue(model_config_json=without) == gather
    assert residue(attention_backend="FLASHMLA_SPARSE") - residue() == 301_989_888 - gather
    indexer_weights = LAYERS * (1536 * 64 * 128 * 2 + 7168 * 192 * 2 + 2 * 128 * 4)
    assert weights() - weights(model_config_json=without) == indexer_weights + 2048 * 2048 * 4


def test_sparse_mla_context_workspace_is_capped_by_top_k() -> None:
    """sparse_mla_attention.py: min(max(8 x max_model_len, 4 x max_num_seqs x block),
    64 Ki, max_num_seqs x index_topk) tokens. The lab grid: min(max(32,768, 16,384), 65,536,
    131,072) = 32,768; at 8 sequences: min(max(32,768, 2,048), 65,536, 16,384) = 16,384."""
    assert setup(_request()).mla_workspace_tokens == 32768
    assert setup(_request(max_num_seqs=8)).mla_workspace_tokens == 16384


def test_the_context_terms_range_is_padded_v_and_a_second_chunk() -> None:
    # The H200 DSA starts reach the dense chunk over cached context (calls 41-42), so the range
    # is MLA's, by hand at the lab grid (FA3 assumed: v not padded in the term): FA2's padded v
    # of the 32,768-row chunk, 32,768 x 128 heads x 192 x BF16 = 1.5 GiB, and of the step's
    # 2,048 rows, 96 MiB; a second whole chunk's kv_nope, 32,768 x 128 x (128 + 128) x BF16 =
    # 2 GiB; at most one 2 MiB small-segment rounding beside.
    terms = {t.name: t for t in preflight(_request()).term_details}
    context = terms["mla_context_bytes"]
    # less the prompt-logprobs chunk the activation term holds (1,024 x 129,280 bf16 logits, a
    # 254 MiB segment): the two steps' transients combine by max
    assert context.bytes >= 2 * 1024**3 + 1536 * MiB - 254 * MiB
    by_hand = 2048 * MiB + 1536 * MiB + 96 * MiB
    assert by_hand <= context.uncertainty_bytes <= by_hand + 2 * MiB

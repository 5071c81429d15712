"""TRITON_MLA's decode-logits reservation (memest.estimate.terms.mla_decode), hand-derived from
vLLM 0.33.0's triton_mla.py: (max_num_seqs x (1 + K), heads, splits, kv_lora_rank + 1) float32,
splits = min(next_pow2(max_model_len // 512), 2 x SMs)."""

from __future__ import annotations

from memest.estimate.model_shape import model_shape
from memest.estimate.terms.mla_decode import logits_workspace_bytes, num_kv_splits

#: A 64-head MLA shape (kv_lora_rank 256), dense layers only: the lab's mla64h_kv256_8l model.
MLA64 = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "kv_lora_rank": 256,
    "q_lora_rank": 768,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "num_hidden_layers": 8,
    "first_k_dense_replace": 8,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1408,
    "n_shared_experts": 1,
    "max_position_embeddings": 32768,
    "vocab_size": 102400,
    "torch_dtype": "bfloat16",
}


def test_splits_follow_the_longest_sequence() -> None:
    assert num_kv_splits(8192, 132) == 16  # 8192 // 512 = 16
    assert num_kv_splits(4096, 132) == 8
    assert num_kv_splits(1000, 132) == 1  # 1000 // 512 = 1
    assert num_kv_splits(1 << 22, 132) == 264  # capped at 2 x SMs


def test_vllm_serve_defaults_reserve_a_gib() -> None:
    shape = model_shape(MLA64)
    got = logits_workspace_bytes(
        shape,
        "TRITON_MLA",
        max_num_seqs=1024,
        max_model_len=8192,
        num_speculative_tokens=0,
        sms=132,
    )
    # 1024 x 64 x 16 x 257 x 4 B; the profile run of reports/vllm call 44 (K_mla64h8l at
    # 1,024 seqs / 8,192 tokens) kept 1.063 GiB allocated past the weights, call 42 (64 / 2,048,
    # max_model_len 4,096) 0.059 GiB.
    assert got == 1024 * 64 * 16 * 257 * 4 == 1_077_936_128
    small = logits_workspace_bytes(
        shape, "TRITON_MLA", max_num_seqs=64, max_model_len=4096, num_speculative_tokens=0, sms=132
    )
    assert small == 64 * 64 * 8 * 257 * 4


def test_speculative_rows_and_other_backends() -> None:
    shape = model_shape(MLA64)
    k3 = logits_workspace_bytes(
        shape, "TRITON_MLA", max_num_seqs=64, max_model_len=4096, num_speculative_tokens=3, sms=132
    )
    assert k3 == 64 * 4 * 64 * 8 * 257 * 4
    for backend in ("FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA", "TRITON_ATTN"):
        assert (
            logits_workspace_bytes(
                shape,
                backend,
                max_num_seqs=64,
                max_model_len=4096,
                num_speculative_tokens=0,
                sms=132,
            )
            == 0
        )

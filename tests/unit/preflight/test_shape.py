"""Model shapes and parameter bytes from config.json, checked against vLLM's own figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.errors import ConfigError
from memest.estimate.kv import kv_bytes_per_token
from memest.estimate.terms.shape import model_shape, parameter_bytes
from memest.preflight.predict import kv_spec, setup
from memest.schema import RunReport
from memest.schema.preflight import PreflightRequest

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "tests/data/configs"
LLAMA = json.loads((CONFIGS / "llama8b.json").read_text())
QWEN_MOE = json.loads((ROOT / "lab/models/qwen3moe_8l/config.json").read_text())
DSV2 = json.loads((ROOT / "lab/models/dsv2lite_8l/config.json").read_text())
START = ROOT / "tests/data/starts/call3.A_llama8b_s128_t4096.enable.report.rank0.json"


def test_llama_weights_match_what_vllm_counted_on_the_h200() -> None:
    report = RunReport.model_validate_json(START.read_text())
    assert report.vllm is not None and report.vllm.weights_bytes is not None
    ours = parameter_bytes(model_shape(LLAMA))
    # vLLM's own model-loading figure for this config; the rest is buffers under 0.1 MiB
    assert abs(ours - report.vllm.weights_bytes) < 100_000


def test_tied_embeddings_drop_the_lm_head() -> None:
    untied = parameter_bytes(model_shape(LLAMA))
    tied = parameter_bytes(model_shape({**LLAMA, "tie_word_embeddings": True}))
    assert untied - tied == 128256 * 4096 * 2  # one vocab x hidden matrix in bf16


def test_tensor_parallel_halves_everything_but_norms() -> None:
    one = parameter_bytes(model_shape(LLAMA, tp=1))
    two = parameter_bytes(model_shape(LLAMA, tp=2))
    replicated = (32 * 2 * 4096 + 4096 + 8192 * 128) * 2  # norms and the rotary cache
    assert two == (one - replicated) // 2 + replicated


def test_moe_experts_counted_per_layer() -> None:
    s = model_shape(QWEN_MOE)
    assert s.family == "moe" and s.moe_layers == 8 and s.experts == 128
    attention = 2048 * (32 + 2 * 4) * 128 + 32 * 128 * 2048 + 2 * 128  # q_norm, k_norm
    experts = 128 * 3 * 2048 * 768 + 2048 * 128
    per_layer = attention + experts + 2 * 2048
    embed = 151936 * 2048 * 2
    expected = 8 * per_layer + 2048 + embed + 40960 * 128
    assert parameter_bytes(s) == expected * 2


def test_mla_kv_is_the_latent_per_layer() -> None:
    req = PreflightRequest.model_validate({"model_config": DSV2, "max_num_seqs": 8})
    spec = kv_spec(setup(req))
    # DeepSeek-V2: 512 latent + 64 RoPE values per token and layer, bf16, 8 layers
    assert kv_bytes_per_token(spec) == (512 + 64) * 2 * 8


def test_gqa_kv_with_tp_splits_heads() -> None:
    one = kv_spec(setup(PreflightRequest.model_validate({"model_config": LLAMA})))
    two = kv_spec(
        setup(PreflightRequest.model_validate({"model_config": LLAMA, "tensor_parallel_size": 2}))
    )
    assert kv_bytes_per_token(one) == 32 * 2 * 8 * 128 * 2
    assert kv_bytes_per_token(two) * 2 == kv_bytes_per_token(one)


def test_missing_field_is_named() -> None:
    cfg = {k: v for k, v in LLAMA.items() if k != "hidden_size"}
    with pytest.raises(ConfigError, match="model_config.hidden_size"):
        model_shape(cfg)


def test_heads_not_divisible_by_tp_is_named() -> None:
    with pytest.raises(ConfigError, match="num_attention_heads"):
        model_shape(LLAMA, tp=3)

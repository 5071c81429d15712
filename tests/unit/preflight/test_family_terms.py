"""The pre-flight's MoE and MLA terms from vLLM 0.33.0's code (memest.preflight.predict):
the activation law without the routed experts' caches, and the ranges stated for each."""

from __future__ import annotations

import json
from pathlib import Path

from memest.estimate.activation import activation_shape
from memest.estimate.model_shape import layer_token_bytes, model_shape
from memest.preflight.predict import preflight, request_from

ROOT = Path(__file__).resolve().parents[3]
MIXTRAL = json.loads((ROOT / "lab/models/mixtral_4l/config.json").read_text())
DSV3 = json.loads((ROOT / "lab/models/dsv3_5l/config.json").read_text())
LLAMA = json.loads((ROOT / "examples/llama8b.config.json").read_text())
GiB = 1 << 30


def test_mixtral_layer_without_the_routed_caches_by_hand() -> None:
    """Mixtral: 2 B x (5 x 4,096 hidden-wide + q, k, v (32 + 2 x 8) x 128 + KV 8 x 128) = 55,296 B
    per token; the routed caches the Triton experts keep in the workspace would add 2 B x 3 x
    2 x 14,336 (gate_up and the activation of top-2 experts) = 172,032 B."""
    shape = model_shape(MIXTRAL)
    assert layer_token_bytes(activation_shape(shape)) == 55296
    assert layer_token_bytes(shape) == 55296 + 172032


def test_dense_models_are_read_as_they_were() -> None:
    shape = model_shape(LLAMA)
    assert activation_shape(shape) is shape


def test_deepseek_v3_attention_input_holds_q_lora() -> None:
    """With q_lora_rank, fused_qkv_a_proj writes q's latent (1,536) beside kv's (512 + 64), and
    q_b_proj 128 heads x 192: 24,576 + 2,112 = 26,688 per token."""
    assert model_shape(DSV3).qkv == 26688


def test_ranges_are_stated_for_moe_and_mla() -> None:
    """DeepSeek-V3's attention with FA3 assumed (no flash_attn_version given): the MLA range is
    FA2's padded v (32,768 + 2,048 rows x 128 x 192 x 2 B = 1.5 GiB + 96 MiB) and a second chunk's
    kv_nope (2 GiB). Its three dense layers (intermediate 18,432) are as wide as a MoE layer's
    top-8 x 2,048 + 2,048 shared: the activation law does not move, and states no MoE range.
    Mixtral (all layers MoE) does."""
    req = request_from(
        {
            "model_config": DSV3,
            "max_num_seqs": 64,
            "max_num_batched_tokens": 2048,
            "max_model_len": 4096,
            "gpu": "h200",
        }
    )
    result = preflight(req)
    detail = {t.name: t for t in result.term_details}
    mla = detail["mla_context_bytes"]
    calibrated = mla.uncertainty_bytes - (3 * GiB // 2 + 96 * (1 << 20) + 2 * GiB)
    assert 0 <= calibrated < 16 << 20  # the calibration's own small uncertainty for the term
    assert any(n.startswith("MLA:") for n in result.notes)
    assert not any(n.startswith("MoE:") for n in result.notes)
    mixtral = preflight(request_from({"model_config": MIXTRAL, "gpu": "h200"}))
    assert any(n.startswith("MoE:") for n in mixtral.notes)

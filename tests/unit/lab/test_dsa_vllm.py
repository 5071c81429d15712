"""The DSA stand-ins (lab/dsa_standins.py) inside vLLM 0.33.0 itself, on this CPU.

dsa_vllm_cpu.py runs in a subprocess on vLLM's CPU platform: vLLM's own indexer wrappers called
through the registered stand-ins, and DeepseekV32ForCausalLM (lab/models/dsv32_4l) built on the
meta device: the CPU platform's class and the nvidia class an H200 builds. So the patching of
vLLM's modules is checked here before an H200 start spends device time on it. Expected values
are worked by hand below, or are vLLM's own torch references (rocm_aiter_mla_sparse.py), which
the script compares with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_or_skip

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def checks() -> dict[str, dict[str, Any]]:
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "WARNING"}
    script = Path(__file__).with_name("dsa_vllm_cpu.py")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["check"]: row for row in rows}


def test_the_stand_ins_patch_vllms_indexer_modules(checks: dict[str, dict[str, Any]]) -> None:
    names = set(checks["registered"]["names"])
    assert {
        "vllm.model_executor.layers.sparse_attn_indexer.has_deep_gemm",
        "vllm.v1.attention.backends.mla.indexer.has_deep_gemm",
        "vllm.utils.deep_gemm._fp8_fp4_paged_mqa_logits_impl",
        "_C_cache_ops::indexer_k_quant_and_cache",
        "_C::top_k_per_row_decode",
    } <= names


def test_vllms_cache_wrappers_round_trip(checks: dict[str, dict[str, Any]]) -> None:
    # tokens 0..5 (first value 1, 2, 4, ..., 32) go to slots 5..10; the gather reads sequence
    # positions 0..5 through block table [1, 2]: position 0 is block 1 slot 0, never written;
    # positions 1..5 are tokens 0..4, exact in FP8 with a power-of-two (ue8m0) scale
    assert checks["cache"]["dequantized"] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0]


def test_vllms_paged_logits_wrapper_matches_vllms_reference(
    checks: dict[str, dict[str, Any]],
) -> None:
    paged = checks["paged_logits"]
    # [B * next_n, max_model_len] in FP32: the H200's (SM90) DeepGEMM contract
    assert paged["shape"] == [3, 16] and paged["dtype"] == "torch.float32"
    assert paged["rel_error"] < 1e-5  # both in FP32 over the same FP8 values


def test_vllms_prefill_logits_wrapper_matches_vllms_reference(
    checks: dict[str, dict[str, Any]],
) -> None:
    prefill = checks["prefill_logits"]
    # 5 query rows; the widest K range is 9 - 3 = 6 positions, compressed to column 0
    assert prefill["shape"] == [5, 6] and prefill["dtype"] == "torch.float32"
    assert prefill["rel_error"] < 1e-2  # vLLM's reference multiplies in BF16


def test_vllms_decode_topk_wrapper(checks: dict[str, dict[str, Any]]) -> None:
    # row 0 scores its first 3 columns (0, 5, 1): columns 1, 2; row 1 all 5: columns 4 (9), 3 (8)
    assert checks["decode_topk"]["indices"] == [[1, 2], [4, 3]]


def test_deepseek_v32_builds_on_meta_with_the_stand_ins(
    checks: dict[str, dict[str, Any]],
) -> None:
    kv = checks["meta_build"]["kv"]
    # 4 layers, each the indexer's FP8 key cache (128 values + one fp32 scale per 128 = 132 B per
    # token) and MLA's latent cache (kv_lora_rank 512 + rope 64 = 576 BF16 values), block 16 on
    # the CPU platform
    indexer = {"kind": "MLAAttentionSpec", "page_size_bytes": 16 * 132}
    latent = {"kind": "MLAAttentionSpec", "page_size_bytes": 16 * 576 * 2}
    assert [{k: s[k] for k in ("kind", "page_size_bytes")} for s in kv] == [indexer, latent] * 4
    assert [s["head_size"] for s in kv] == [132, 576] * 4


def test_flashmla_sparse_calls_the_stand_in_once_provided(
    checks: dict[str, dict[str, Any]],
) -> None:
    # FlashMLASparseImpl._bf16_flash_mla_kernel calls flash_mla_sparse_fwd by its module's name
    assert checks["sparse_mla"]["served"] is True


def test_the_h200s_deepseek_v32_class_builds_on_meta(checks: dict[str, dict[str, Any]]) -> None:
    h200 = checks["meta_build_h200"]
    assert h200["built"] == ["vllm.models.deepseek_v32.nvidia.model.DeepseekV32ForCausalLM"]
    # its layers register MLA's latent cache before the indexer's key cache
    latent = {"kind": "MLAAttentionSpec", "page_size_bytes": 16 * 576 * 2}
    indexer = {"kind": "MLAAttentionSpec", "page_size_bytes": 16 * 132}
    kv = h200["kv"]
    assert [{k: s[k] for k in ("kind", "page_size_bytes")} for s in kv] == [latent, indexer] * 4
    # lab/models/dsv32_4l by hand, BF16 unless noted: per layer the fused q/kv A projection
    # 7168 x (1536 + 512 + 64), q_b 1536 x 128 x 192, kv_b 512 x 128 x (128 + 128), o_proj
    # 128 x 128 x 7168, norms 1536 + 512 + 2 x 7168; the indexer's wq_b 1536 x 64 x 128 and
    # wk + weights_proj 7168 x (128 + 64); the dense MLP 7168 x 2 x 18432 + 18432 x 7168; the
    # indexer's k_norm (LayerNorm(128), weight and bias) in FP32; plus embedding and lm_head
    # 2 x 129280 x 7168 and the final norm 7168
    layer_bf16 = (
        7168 * 2112
        + 1536 * 128 * 192
        + 512 * 128 * 256
        + 128 * 128 * 7168
        + 1536
        + 512
        + 2 * 7168
        + 1536 * 64 * 128
        + 7168 * (128 + 64)
        + 7168 * 2 * 18432
        + 18432 * 7168
    )
    want = 2 * (4 * layer_bf16 + 2 * 129280 * 7168 + 7168) + 4 * 4 * 256
    assert h200["param_bytes"] == want

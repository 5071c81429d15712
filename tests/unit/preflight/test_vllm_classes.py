"""Shapes, KV bytes per token and block sizes against the installed vLLM's own classes (0.33.0;
0.34.0 in scripts/test-vllm034.sh), on this CPU.

The MoE and MLA configs in lab/models were never started on a GPU; here vLLM's real model
classes are built for them on the meta device (vllm_meta.py, in a subprocess on vLLM's CPU
platform) and their parameters, buffers and KV-cache specs are read per tensor-parallel rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memest.estimate.fused_moe import fused_moe_workspace_bytes
from memest.estimate.kv import kv_bytes_per_token
from memest.estimate.terms.shape import model_shape, parameter_bytes
from memest.preflight.backends import KERNEL_BLOCKS, kv_block_size, preferred, supports
from memest.preflight.predict import kv_spec, setup
from memest.schema.preflight import PreflightRequest
from memest.vllm_versions import resolve_version
from tests.conftest import require_or_skip

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = {
    "qwen3moe": ROOT / "lab/models/qwen3moe_8l/config.json",
    "dsv2lite": ROOT / "lab/models/dsv2lite_8l/config.json",
    "llama8b": ROOT / "tests/data/configs/llama8b.json",
}
TPS = (1, 2)


@pytest.fixture(scope="module")
def vllm_meta() -> dict[str, Any]:
    """What vllm_meta.py prints for every config, TP size and backend."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "WARNING"}
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("vllm_meta.py")),
        "--tp",
        ",".join(map(str, TPS)),
        "--backends",
        ",".join(KERNEL_BLOCKS),
        *(str(p) for p in CONFIGS.values()),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    out: dict[str, Any] = {"models": {}}
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "backends" in row:
            out["backends"] = row["backends"]
        else:
            out["models"][(row["config"], row["tp"])] = row
    return out


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_weights_per_rank_are_what_vllms_model_class_allocates(
    vllm_meta: dict[str, Any], name: str, tp: int
) -> None:
    row = vllm_meta["models"][(str(CONFIGS[name]), tp)]
    cfg = json.loads(CONFIGS[name].read_text())
    # parameters plus the rotary cos/sin cache, to the byte
    assert parameter_bytes(model_shape(cfg, tp=tp)) == row["param_bytes"] + row["buffer_bytes"]


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_moe_workspace_is_what_vllms_workspace_manager_holds(
    vllm_meta: dict[str, Any], name: str, tp: int
) -> None:
    """TritonExperts' workspace shapes for the model class's own experts layer, requested from
    vLLM's WorkspaceManager as the modular kernel requests them (vllm_meta.MOE_TOKENS tokens)."""
    row = vllm_meta["models"][(str(CONFIGS[name]), tp)]
    shape = model_shape(json.loads(CONFIGS[name].read_text()), tp=tp)
    got = row["moe_workspace_bytes"]
    assert fused_moe_workspace_bytes(shape, 2048) == (got if got is not None else 0)
    assert (got is None) == (shape.moe_layers == 0)


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_kv_bytes_per_token_are_vllms_kv_cache_spec(
    vllm_meta: dict[str, Any], name: str, tp: int
) -> None:
    row = vllm_meta["models"][(str(CONFIGS[name]), tp)]
    cfg = json.loads(CONFIGS[name].read_text())
    ours = kv_spec(
        setup(PreflightRequest.model_validate({"model_config": cfg, "tensor_parallel_size": tp}))
    )
    layers = row["kv"]
    assert len(layers) == ours.num_layers == cfg["num_hidden_layers"]
    assert kv_bytes_per_token(ours) == sum(s["page_size_bytes"] // s["block_size"] for s in layers)
    if "kv_lora_rank" in cfg:  # MLA: one latent + RoPE "head", replicated under TP
        assert {s["kind"] for s in layers} == {"MLAAttentionSpec"}
        assert {(s["num_kv_heads"], s["head_size"]) for s in layers} == {
            (1, cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
        }
        assert ours.kind == "mla"


def test_block_size_rule_is_each_backend_classes_own(vllm_meta: dict[str, Any]) -> None:
    """Every backend class that imports on a CPU: the sizes it accepts and its preferred one for
    the installed release's default (memest.vllm_versions: the installed release's row)."""
    checked = []
    for name, got in vllm_meta["backends"].items():
        if "error" in got:  # FLASH_ATTN_MLA and CUTLASS_MLA import GPU kernels
            continue
        assert [n for n in range(1, 257) if supports(name, n)] == got["supports"], name
        assert preferred(name) == got["preferred"], name
        checked.append(name)
    assert {"FLASH_ATTN", "FLASHINFER", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"} <= set(checked)
    assert kv_block_size(mla=True, sm100=False, backend="FLASHMLA") == (64, "FLASHMLA")
    # FLASH_ATTN takes any multiple of 16, so its preferred size is the release's default
    assert vllm_meta["backends"]["FLASH_ATTN"]["preferred"] == resolve_version().default_block_size

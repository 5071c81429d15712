"""FP8 weights against vLLM 0.33.0's own classes: each quantization config's model is built on the
meta device on this CPU (vllm_meta.py, a stand-in for the scaled-mm kernel that no CPU build has)
and its parameter bytes, scale tensors and ignored layers included, are compared with memest's
weights term to the byte.

Online quantization (``--quantization fp8_per_tensor``) is not here: its linear methods create
bf16 weights on the meta device and quantize each layer as it loads, so a meta build holds the
checkpoint's bf16 shapes, not what the GPU ends with (tests/unit/preflight/test_fp8.py derives it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memest.estimate.terms.shape import model_shape, parameter_bytes
from tests.conftest import require_or_skip

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]
BASES = {  # two decoder layers each (DeepSeek: one dense, one MoE) keep the builds fast
    "qwen3moe": ROOT / "lab/models/qwen3moe_8l/config.json",
    "dsv2lite": ROOT / "lab/models/dsv2lite_8l/config.json",
    "dsv3": ROOT / "lab/models/dsv3_5l/config.json",  # MLA with q_lora_rank: fused_qkv_a_proj
    "llama8b": ROOT / "tests/data/configs/llama8b.json",
}
TENSOR = {"quant_method": "fp8", "activation_scheme": "dynamic"}
BLOCK = {**TENSOR, "weight_block_size": [128, 128]}
SYMMETRIC = {"dynamic": False, "symmetric": True}
CHANNEL_CT = {  # per-channel weights, per-token dynamic activations (llm-compressor's FP8_DYNAMIC)
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", **SYMMETRIC},
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "dynamic": True,
                "symmetric": True,
            },
            "targets": ["Linear"],
        }
    },
    "ignore": ["lm_head", "re:.*layers.0.mlp.down_proj"],
}
MODELOPT = {
    "quant_method": "modelopt",
    "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head", "*layers.1.self_attn*"]},
}
IGNORED_DENSE = {
    **TENSOR,
    "ignored_layers": [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.1.mlp.down_proj",
    ],
}
IGNORED_MOE = {  # the router gate, every expert of layer 1 (one named), one attention output
    **BLOCK,
    "ignored_layers": [
        "model.layers.0.mlp.gate",
        "model.layers.1.mlp.experts.0.gate_proj",
        "model.layers.1.self_attn.o_proj",
    ],
}
#: Block FP8 on DeepSeek-V2-Lite is left out: its 1,408-wide experts split over two ranks do
#: not tile into 128-wide blocks, and vLLM refuses that build.
TPS = (1, 2)
#: (base, quantization_config); MoE bases first: vLLM builds its expert-parallel group once.
CASES = {
    "qwen3moe-tensor": ("qwen3moe", TENSOR),
    "qwen3moe-block": ("qwen3moe", BLOCK),
    "qwen3moe-channel-ct": ("qwen3moe", CHANNEL_CT),
    "qwen3moe-ignored": ("qwen3moe", IGNORED_MOE),
    "dsv2lite-tensor": ("dsv2lite", TENSOR),
    "dsv3-block": ("dsv3", BLOCK),
    "llama8b-tensor": ("llama8b", TENSOR),
    "llama8b-block": ("llama8b", BLOCK),
    "llama8b-channel-ct": ("llama8b", CHANNEL_CT),
    "llama8b-modelopt": ("llama8b", MODELOPT),
    "llama8b-ignored": ("llama8b", IGNORED_DENSE),
}


def _config(name: str) -> dict[str, Any]:
    base, qc = CASES[name]
    cfg = json.loads(BASES[base].read_text())
    return {**cfg, "num_hidden_layers": 2, "first_k_dense_replace": 1, "quantization_config": qc}


@pytest.fixture(scope="module")
def vllm_fp8(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], dict[str, Any]]:
    """What vllm_meta.py prints for every case and TP size, by (case name, TP)."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")
    folder = tmp_path_factory.mktemp("fp8")
    paths = {}
    for name in CASES:
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(_config(name)))
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "WARNING"}
    script = str(Path(__file__).with_name("vllm_meta.py"))
    tps = ",".join(map(str, TPS))
    cmd = [sys.executable, script, "--tp", tps, *(str(p) for p in paths.values())]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    by_path = {str(p): n for n, p in paths.items()}
    rows = (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
    return {(by_path[row["config"]], row["tp"]): row for row in rows}


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("name", list(CASES))
def test_fp8_weights_are_what_vllms_model_class_allocates(
    vllm_fp8: dict[tuple[str, int], dict[str, Any]], name: str, tp: int
) -> None:
    row = vllm_fp8[(name, tp)]
    assert row["param_bytes_by_dtype"].get("float8_e4m3fn", 0) > 0  # vLLM did quantize
    ours = parameter_bytes(model_shape(_config(name), tp=tp))
    assert ours == row["param_bytes"] + row["buffer_bytes"]


@pytest.mark.parametrize("name", ["llama8b-ignored", "qwen3moe-ignored", "llama8b-channel-ct"])
def test_ignored_layers_stay_in_the_model_dtype(
    vllm_fp8: dict[tuple[str, int], dict[str, Any]], name: str
) -> None:
    """The ignore list moves bytes from FP8 to bf16 in vLLM's build; memest's figure follows."""
    base = {"llama8b-channel-ct": "llama8b-tensor"}.get(name, name.replace("ignored", "tensor"))
    if name == "qwen3moe-ignored":
        base = "qwen3moe-block"
    ignored = vllm_fp8[(name, 1)]["param_bytes_by_dtype"]
    plain = vllm_fp8[(base, 1)]["param_bytes_by_dtype"]
    assert ignored["bfloat16"] > plain["bfloat16"]
    assert ignored["float8_e4m3fn"] < plain["float8_e4m3fn"]
    cfg = _config(name)
    without = {**cfg, "quantization_config": {**cfg["quantization_config"], "ignore": []}}
    without["quantization_config"].pop("ignored_layers", None)
    assert parameter_bytes(model_shape(cfg)) > parameter_bytes(model_shape(without))

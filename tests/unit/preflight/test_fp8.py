"""memest preflight for FP8: --kv-cache-dtype and FP8 checkpoints, against real H200 starts.

F_llama8b_s128_t4096_fp8kv (reports/vllm/raw/results.call23.jsonl) is config A's flags with
--kv-cache-dtype fp8; its apply start's KV cache: 109,585,629,184 B, 1,672,144 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "tests/data/configs/llama8b.json"
GRID = [
    "--gpu",
    "h200",
    "--max-num-seqs",
    "128",
    "--max-num-batched-tokens",
    "4096",
    "--max-model-len",
    "4096",
    "--gpu-memory-utilization",
    "0.85",
]
F_APPLY_KV_BYTES = 109_585_629_184
GIB = 1 << 30


def _preflight(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["preflight", "--model-config", str(LLAMA), *GRID, "--json", *args]) == 0
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


def test_fp8_kv_cache_lands_near_the_fp8_start(capsys: pytest.CaptureFixture[str]) -> None:
    got = _preflight(capsys, "--kv-cache-dtype", "fp8")
    assert got["kv_bytes_per_token"] == 65_536  # 2 x 8 heads x 128 x 32 layers x 1 B
    kv = got["kv_cache"]
    assert isinstance(kv, dict) and kv["dtype"] == "fp8" and kv["dtype_bytes"] == 1
    cache = got["kv_cache_bytes"]
    assert isinstance(cache, int) and abs(cache - F_APPLY_KV_BYTES) < GIB // 4


def test_fp8_kv_cache_holds_twice_the_tokens_of_the_same_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bf16 = _preflight(capsys)
    fp8 = _preflight(capsys, "--kv-cache-dtype", "fp8_e5m2")
    assert bf16["kv_budget_bytes"] == fp8["kv_budget_bytes"]
    assert fp8["kv_tokens"] == fp8["kv_cache_bytes"] // 1_048_576 * 16  # type: ignore[operator]
    assert bf16["kv_tokens"] == bf16["kv_cache_bytes"] // 2_097_152 * 16  # type: ignore[operator]


def test_an_unknown_kv_dtype_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["preflight", "--model-config", str(LLAMA), *GRID, "--kv-cache-dtype", "int3"])
    err = capsys.readouterr().err
    assert code == 2 and "kv_cache_dtype" in err and len(err.strip().splitlines()) == 1


FP8_CHECKPOINT = ROOT / "lab/models/llama8b_fp8/config.json"
# reports/vllm/raw/call24.Q8_llama8b_fp8w_s128_t4096.apply.report.rank0.json: its weights term
# (memest.estimate.account) and its KV cache (results.call24.jsonl, apply).
Q8_WEIGHTS_TERM = 9_157_014_528
# Call 24 ran no full-batch step: serving's with prompt logprobs takes one more 1,024-row chunk
# of 128,256 bf16 logits (a 252 MiB segment, the growth calls 48-49 measured on Llama-8B).
Q8_APPLY_KV_BYTES = 116_664_565_760 - (252 << 20)


def test_an_fp8_checkpoint_moves_weights_to_what_vllm_allocated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    got = _preflight_config(capsys, FP8_CHECKPOINT)
    terms = got["terms"]
    assert isinstance(terms, dict)
    # Predicted 9,155,067,861 B against 9,157,014,528 B measured (-1.9 MB).
    assert abs(terms["weights_bytes"] - Q8_WEIGHTS_TERM) < 8 << 20
    cache = got["kv_cache_bytes"]
    assert isinstance(cache, int) and abs(cache - Q8_APPLY_KV_BYTES) < GIB // 4


def _preflight_config(
    capsys: pytest.CaptureFixture[str], config: Path, *args: str
) -> dict[str, object]:
    assert main(["preflight", "--model-config", str(config), *GRID, "--json", *args]) == 0
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


def _fp8_config(tmp_path: Path, quantization_config: dict[str, object]) -> Path:
    cfg = {**json.loads(LLAMA.read_text()), "quantization_config": quantization_config}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _weights(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> int:
    terms = _preflight_config(capsys, config, *args)["terms"]
    assert isinstance(terms, dict)
    return int(terms["weights_bytes"])


# Llama-8B's linear layers per decoder layer (32 layers): qkv 6,144 x 4,096 in 3 shards,
# o 4,096 x 4,096, gate_up 28,672 x 4,096 in 2 shards, down 4,096 x 14,336.
LINEAR_ROWS = (6_144, 4_096, 28_672, 4_096)
SHARDS = (3, 1, 2, 1)


def test_scale_tensors_by_scheme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tensor = _weights(capsys, _fp8_config(tmp_path, {"quant_method": "fp8"}))
    static = _weights(
        capsys, _fp8_config(tmp_path, {"quant_method": "fp8", "activation_scheme": "static"})
    )
    block = _weights(
        capsys,
        _fp8_config(tmp_path, {"quant_method": "fp8", "weight_block_size": [128, 128]}),
    )
    channel = _weights(capsys, LLAMA, "--quantization", "fp8_per_channel")
    # static: one float32 input scale per logical shard
    assert static - tensor == 32 * sum(SHARDS) * 4
    # per-channel: one float32 per output row instead of one per shard; online, so without the
    # checkpoint's four bf16 q/k/v/prob scales per attention layer
    assert channel - tensor == 32 * (sum(LINEAR_ROWS) - sum(SHARDS)) * 4 - 32 * 4 * 2
    # blocks: ceil(N/128) x ceil(K/128) float32 (K: 4,096 for qkv, o, gate_up; 14,336 for down)
    tiles = 48 * 32 + 32 * 32 + 224 * 32 + 32 * 112
    assert block - tensor == 32 * (tiles - sum(SHARDS)) * 4


def test_compressed_tensors_and_modelopt_forms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fp8 = _weights(capsys, _fp8_config(tmp_path, {"quant_method": "fp8"}))
    group = {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
        "targets": ["Linear"],
    }
    ct = _weights(
        capsys,
        _fp8_config(
            tmp_path,
            {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}},
        ),
    )
    # per-channel scales; attention: float32 q/k/v scales and bf16 q/k/v zero points instead of
    # four bf16 q/k/v/prob scales (vLLM 0.33.0's KV-cache methods of each)
    assert ct - fp8 == 32 * (sum(LINEAR_ROWS) - sum(SHARDS)) * 4 + 32 * (3 * (4 + 2) - 4 * 2)
    modelopt = _weights(
        capsys, _fp8_config(tmp_path, {"quant_method": "modelopt", "quant_algo": "FP8"})
    )
    assert modelopt - fp8 == 32 * sum(SHARDS) * 4  # static input scales


def test_fp8_halves_only_the_linear_layers(capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = _weights(capsys, LLAMA)
    fp8 = _weights(capsys, LLAMA, "--quantization", "fp8_per_tensor")
    linear = 32 * (6_144 * 4_096 + 4_096 * 4_096 + 28_672 * 4_096 + 4_096 * 14_336)
    # online: one float32 scale per fused layer (vLLM 0.33.0 Fp8PerTensorOnlineLinearMethod
    # quantizes the loaded bf16 weight with a single amax), four layers per decoder layer
    assert bf16 - fp8 == linear - 32 * len(SHARDS) * 4


@pytest.mark.parametrize(
    ("args", "field"),
    [(("--quantization", "fp8"), "quantization"), (("--quantization", "awq"), "quantization")],
)
def test_refused_quantization_is_one_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], field: str
) -> None:
    code = main(["preflight", "--model-config", str(LLAMA), *GRID, *args])
    err = capsys.readouterr().err
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1

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

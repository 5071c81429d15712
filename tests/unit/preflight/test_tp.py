"""The pre-flight at TP > 1: what TP adds outside PyTorch per rank (memest.estimate.parallel).

Expected differences are worked out by hand from NCCL 2.30's and vLLM 0.33.0's defaults (the
arithmetic is in tests/unit/estimate/test_parallel.py's constants, restated here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memest.cli import main

ROOT = Path(__file__).resolve().parents[3]
LLAMA = ROOT / "tests/data/configs/llama8b.json"  # hidden 4096
DSV2 = ROOT / "lab/models/dsv2lite_8l/config.json"  # MLA with routed experts
GRID = ["--max-num-seqs", "128", "--max-num-batched-tokens", "4096", "--max-model-len", "4096"]
MiB = 1 << 20
# One ring channel: send 4096 B + 4 MiB -> 6 MiB, recv 4096 B + 512 KiB + 4,915,200 B -> 6 MiB.
CHANNEL = 12 * MiB
# TP=2 on an H200: 24 channels x 12 MiB = 288 MiB of NCCL; custom all-reduce 10 + 16 MiB;
# symmetric memory 64 MiB + pad -> 66 MiB; FlashInfer (hidden 4096) 128 + 2 + 384 MiB.
TP2_OUTSIDE = 288 * MiB + 26 * MiB + 66 * MiB + 514 * MiB


def _terms(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["preflight", *args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    return {t["name"]: t for t in got["term_details"]} | {"_notes": got["notes"]}


def _outside(t: dict[str, Any]) -> int:
    return int(t["outside_torch_bytes"]["bytes"])


def test_tp2_adds_nccl_and_all_reduce_buffers(capsys: pytest.CaptureFixture[str]) -> None:
    one = _terms(capsys, "--model-config", str(LLAMA), *GRID)
    two = _terms(capsys, "--model-config", str(LLAMA), *GRID, "--tensor-parallel-size", "2")
    assert _outside(two) - _outside(one) == TP2_OUTSIDE
    # custom all-reduce's rank_data is a torch tensor: 8 MiB in the baseline
    base = "baseline_torch_bytes"
    assert two[base]["bytes"] - one[base]["bytes"] == 8 * MiB
    assert "NCCL tp (2 ranks) 288 MiB" in two["outside_torch_bytes"]["law"]
    assert "TP" not in one["outside_torch_bytes"]["law"]
    # TP=2 is unmeasured: the range widens by 8 channels x 12 MiB + 64 MiB not derived
    widened = two["outside_torch_bytes"]["uncertainty_bytes"]
    assert widened - one["outside_torch_bytes"]["uncertainty_bytes"] == 8 * CHANNEL + 64 * MiB
    assert any("derived from vLLM 0.33.0's and NCCL's code" in n for n in two["_notes"])


def test_custom_all_reduce_off_and_nccl_env(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model-config", str(LLAMA), *GRID, "--tensor-parallel-size", "2"]
    on = _terms(capsys, *args)
    off = _terms(capsys, *args, "--disable-custom-all-reduce")
    assert _outside(on) - _outside(off) == 26 * MiB
    assert on["baseline_torch_bytes"]["bytes"] - off["baseline_torch_bytes"]["bytes"] == 8 * MiB
    few = _terms(capsys, *args, "--env", "NCCL_MAX_NCHANNELS=8")
    assert _outside(on) - _outside(few) == (24 - 8) * CHANNEL


def test_moe_model_gets_the_ep_communicator(capsys: pytest.CaptureFixture[str]) -> None:
    two = _terms(capsys, "--model-config", str(DSV2), "--tensor-parallel-size", "2")
    law = two["outside_torch_bytes"]["law"]
    assert "NCCL tp (2 ranks) 288 MiB" in law and "NCCL ep (2 ranks) 288 MiB" in law


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ("NCCL_ALGO=Ring", "environment.NCCL_ALGO"),
        ("NCCL_BUFFSIZE", "--env"),
        ("NCCL_BUFFSIZE=4M", "NCCL_BUFFSIZE"),
    ],
)
def test_bad_env_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], env: str, needle: str
) -> None:
    code = main(
        ["preflight", "--model-config", str(LLAMA), "--tensor-parallel-size", "2", "--env", env]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1

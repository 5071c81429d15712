"""memest export: quantities rounded up, object names as Kubernetes takes them, refusals in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memest.cli.export import _dns_name, _quantity, engine_args
from memest.errors import CommandError
from memest.files import load_report

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "memest" / "demo" / "h200"


def test_quantities_round_up_to_whole_mib() -> None:
    assert _quantity(2**20) == "1Mi"
    assert _quantity(2**20 + 1) == "2Mi"
    assert _quantity(1) == "1Mi"


def test_names_are_dns_labels() -> None:
    assert _dns_name("Meta-Llama-3-8B-Instruct") == "meta-llama-3-8b-instruct"
    assert _dns_name("org/Model_v2.1") == "org-model-v2-1"
    assert len(_dns_name("x" * 100)) == 63
    with pytest.raises(CommandError, match="--name"):
        _dns_name("///")


def test_engine_args_are_the_starts_flags() -> None:
    report = load_report(DEMO / "call22.S_llama8b_s128_t4096.apply.json")
    args = engine_args(report)
    assert args["--max-num-seqs"] == "128"
    assert args["--max-model-len"] == "4096"
    assert "--tensor-parallel-size" not in args  # TP 1, vLLM's default


def test_a_bad_name_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memest", "export", "aibrix"]
        + [str(DEMO / "call22.S_llama8b_s128_t4096.apply.json"), "--pool", "p", "--name", "///"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--name" in done.stderr

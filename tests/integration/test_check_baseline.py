"""`memest check --baseline`: a start against a baseline of the same model and mode, the
markdown diff with a repro command per row, and the exit codes a CI job gates on."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from memest.cli import main

RAW = Path(__file__).resolve().parents[2] / "tests" / "data" / "starts"
# Two apply starts of one Qwen3 MoE configuration, calls 12 and 15.
M12 = RAW / "call12.M_qwen3moe8l_s64_t2048.apply-hist.report.rank0.json"
M15 = RAW / "call15.M_qwen3moe8l_s64_t2048.apply-hist.report.rank0.json"
ENABLE = RAW / "call20.S_llama8b_s128_t4096.enable.report.rank0.json"
APPLY = RAW / "call22.S_llama8b_s128_t4096.apply.report.rank0.json"


def _tokens(path: Path) -> int:
    """KV tokens as vLLM allocated them: blocks x block size, read from the report's kv_cache."""
    kv = json.loads(path.read_text())["kv_cache"]
    return int(kv["num_blocks"] * kv["block_size"])


def test_more_kv_passes_and_writes_the_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "memory.md"
    code = main(["check", str(M15), "--baseline", str(M12), "--markdown", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    table = out.read_text()
    before, after = _tokens(M12), _tokens(M15)
    assert before < after  # 438,253 -> 438,517 blocks of 16
    row = next(line for line in table.splitlines() if line.startswith("| KV capacity"))
    assert f"| {before:,} | {after:,} | +{after - before:,}" in row and "better" in row
    # The row's command reproduces the row: the same check, that figure's limit alone.
    repro = row.rsplit("`", 2)[1]
    argv = shlex.split(repro)
    assert argv[:2] == ["memest", "check"] and "--max-kv-drop" in argv
    assert main(argv[1:]) == 0


def test_less_kv_past_the_threshold_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = _tokens(M15), _tokens(M12)
    drop = 1 - after / before
    out = tmp_path / "memory.md"
    # Within the default 1% the drop is "worse" but not a regression
    assert main(["check", str(M12), "--baseline", str(M15), "--markdown", str(out)]) == 0
    assert "🟠 worse" in out.read_text()
    # Past a threshold under the drop it is red and the check exits 1
    limit = f"{drop / 2:.6f}"
    argv = ["check", str(M12), "--baseline", str(M15), "--max-kv-drop", limit]
    assert main([*argv, "--markdown", str(out)]) == 1
    assert "🔴 regression" in out.read_text()
    assert "FAIL  KV capacity, tokens vs baseline" in capsys.readouterr().out


def test_a_baseline_of_another_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(APPLY), "--baseline", str(ENABLE)]) == 2
    err = capsys.readouterr().err
    assert "mode 'measure'" in err and "'apply'" in err and len(err.strip().splitlines()) == 1


def test_markdown_needs_a_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(M12), "--markdown", str(tmp_path / "x.md")]) == 2
    assert "--markdown needs --baseline" in capsys.readouterr().err

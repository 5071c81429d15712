"""memest analyze --run DIR: ranks of one run side by side, disagreeing ranks flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main
from memest.schema import RunReport

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests/data/starts/call3.A_llama8b_s128_t4096.enable.report.rank0.json"


def _write_ranks(folder: Path, pool_growth: list[int], world_size: int | None = None) -> None:
    base = RunReport.model_validate_json(REAL.read_text())
    for rank, growth in enumerate(pool_growth):
        assert base.breakdown is not None
        bd = base.breakdown.model_copy(update={"graph_pool_growth_bytes": growth})
        report = base.model_copy(
            update={
                "rank": rank,
                "world_size": world_size or len(pool_growth),
                "report_id": f"r{rank}",
                "breakdown": bd,
            }
        )
        (folder / f"report.rank{rank}.json").write_text(report.model_dump_json())


def test_agreeing_ranks_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_ranks(tmp_path, [65_011_712, 65_011_712])
    assert main(["analyze", "--run", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rank 0 | rank 1" in out
    assert "ranks agree within the thresholds" in out


def test_disagreeing_rank_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN three ranks, one whose graph pool grew 1 GiB more than the others
    _write_ranks(tmp_path, [65_011_712, 65_011_712, 65_011_712 + (1 << 30)])
    # WHEN aggregated THEN rank 2 is flagged on that figure and the exit code gates CI
    assert main(["analyze", "--run", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FLAG rank 2: graph_pool_growth_bytes" in out
    assert "FLAG rank 0" not in out


def test_missing_rank_is_flagged_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_ranks(tmp_path, [65_011_712], world_size=2)
    assert main(["analyze", "--run", str(tmp_path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["missing_ranks"] == [1]
    assert doc["consistent"] is False


def test_empty_folder_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--run", str(tmp_path)]) == 2
    assert "no report.rank<N>.json files" in capsys.readouterr().err


def test_snapshot_and_run_together_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(REAL), "--run", str(tmp_path)]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_tp_run_names_what_tp_adds_per_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = RunReport.model_validate_json(REAL.read_text())
    config = base.config.model_copy(update={"tensor_parallel_size": 2})
    for rank in range(2):
        report = base.model_copy(
            update={"rank": rank, "world_size": 2, "report_id": f"r{rank}", "config": config}
        )
        (tmp_path / f"report.rank{rank}.json").write_text(report.model_dump_json())
    assert main(["analyze", "--run", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # NCCL 288 MiB + custom all-reduce 26 + symmetric memory 66 + FlashInfer 514 = 894 MiB
    assert f"each rank holds {894 / 1024:.3f} GiB outside PyTorch" in out
    assert main(["analyze", "--run", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tp_outside_torch_bytes"] == 894 << 20

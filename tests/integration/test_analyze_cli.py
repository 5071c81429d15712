"""`memest analyze` driven through memest.cli.main: tables, JSON, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from memest.cli import main
from memest.schema.breakdown import Breakdown, MemoryReading, PhaseRecord
from memest.snapshot.tags import StageTag, format_tag

MiB = 1 << 20
FULL = format_tag(StageTag("capture", "target.full", 512, "0,1"))


def _torch_snapshot() -> dict[str, Any]:
    frames = [
        {
            "filename": "/site-packages/vllm/utils/deep_gemm.py",
            "line": 880,
            "name": "fp8_fp4_paged_mqa_logits",
        }
    ]
    return {
        "segments": [
            {"address": 0x1000, "total_size": 64 * MiB, "segment_pool_id": (0, 1), "blocks": []}
        ],
        "device_traces": [
            [
                {
                    "action": "segment_alloc",
                    "addr": 0x1000,
                    "size": 64 * MiB,
                    "stream": 1,
                    "time_us": 1,
                    "frames": frames,
                    "user_metadata": FULL,
                },
                {
                    "action": "alloc",
                    "addr": 0x1000,
                    "size": 64 * MiB,
                    "stream": 1,
                    "time_us": 2,
                    "frames": frames,
                    "user_metadata": FULL,
                },
            ]
        ],
    }


@pytest.fixture
def snap_file(tmp_path: Path) -> Path:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_torch_snapshot()))
    return path


def test_text_tables(snap_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(snap_file), "--unit", "MiB"]) == 0
    out = capsys.readouterr().out
    assert "target.full: allocation that triggers new reserved space" in out
    assert "indexer_logits_bf16" in out
    assert "64.0" in out


def test_markdown(snap_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(snap_file), "--md"]) == 0
    out = capsys.readouterr().out
    assert "| Owner | Added reserved GiB |" in out
    assert "| indexer_logits_bf16 | 0.062 |" in out


def test_json_is_a_breakdown(
    snap_file: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    start = MemoryReading(time_ns=0, device_used_bytes=100 * MiB, torch_reserved_bytes=0)
    end = MemoryReading(
        time_ns=1,
        device_used_bytes=170 * MiB,
        torch_reserved_bytes=64 * MiB,
        pool_reserved_bytes={"0,1": 64 * MiB},
    )
    phases = tmp_path / "phases.json"
    phases.write_text(
        json.dumps(
            {"phases": [PhaseRecord(name="capture", start=start, end=end).model_dump(mode="json")]}
        )
    )
    assert main(["analyze", str(snap_file), "--json", "--phases", str(phases)]) == 0
    bd = Breakdown.model_validate_json(capsys.readouterr().out)
    assert bd.stages[0].pool_growth_bytes == 64 * MiB
    assert bd.phases[0].outside_torch_bytes == 6 * MiB
    assert bd.phases[0].graph_pool_bytes == 64 * MiB


def test_user_rules(snap_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [{"owner": "my_logits", "function": "fp8_*"}]}))
    assert main(["analyze", str(snap_file), "--json", "--rules", str(rules)]) == 0
    bd = Breakdown.model_validate_json(capsys.readouterr().out)
    assert bd.triggers[0].owner == "my_logits"


class _Evil:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    good = pickle.dumps(_torch_snapshot())
    (tmp_path / "cut.pickle").write_bytes(good[: len(good) // 2])
    marker = tmp_path / "pwned"
    (tmp_path / "evil.pickle").write_bytes(pickle.dumps({"segments": [_Evil(marker)]}))
    (tmp_path / "v9.json").write_text(
        json.dumps({"format": "memest.allocator_snapshot", "version": 9})
    )
    (tmp_path / "nokeys.pickle").write_bytes(pickle.dumps({"segments": []}))
    (tmp_path / "ok.pickle").write_bytes(good)
    (tmp_path / "badrules.json").write_text(json.dumps({"rules": [{"owner": "x"}]}))
    (tmp_path / "badphases.json").write_text(json.dumps([{"name": "p"}]))
    d = str(tmp_path)
    return [
        ([f"{d}/cut.pickle"], "truncated"),
        ([f"{d}/evil.pickle"], "refused pickle global posix.system"),
        ([f"{d}/v9.json"], "unknown snapshot version 9"),
        ([f"{d}/nokeys.pickle"], "missing key 'device_traces'"),
        ([f"{d}/missing.json"], "No such file"),
        ([f"{d}/ok.pickle", "--rules", f"{d}/badrules.json"], "a rule needs 'function' or 'file'"),
        ([f"{d}/ok.pickle", "--phases", f"{d}/badphases.json"], "phases[0].start: Field required"),
    ]


def test_bad_input_exit_2_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in _bad_inputs(tmp_path):
        assert main(["analyze", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err, (argv, err)
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "pwned").exists()

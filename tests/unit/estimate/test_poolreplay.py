"""Allocator replay: fidelity on the committed H200 snapshots, what-if with a snapshot, bad input.

The real starts (tests/data/starts, copied from reports/vllm/raw; vLLM 0.33.0, Llama-8B shape): A captures PIECEWISE graphs up to
256 tokens (35 graphs), B up to 64 (11), C adds an EAGLE3 drafter (K=3).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from memest.analysis.replay import analyze
from memest.cli import main
from memest.errors import ReportFormatError
from memest.estimate.poolreplay import pool_trace, replay
from memest.estimate.whatif import measured_plan, pool_predictions, what_if
from memest.schema import CapturePlan, RunReport
from memest.snapshot import Snapshot, empty_snapshot, load_snapshot
from memest.units import MiB

RAW = Path(__file__).resolve().parents[2] / "data" / "starts"  # copies of reports/vllm/raw
RUNS = {
    "A": "call3.A_llama8b_s128_t4096.enable",
    "B": "call4.B_llama8b_s32_t2048.enable",
    "C": "call4.C_llama8b_eagle3k3_s64_t4096.enable",
}


@cache
def _report(name: str) -> RunReport:
    return RunReport.model_validate_json((RAW / f"{RUNS[name]}.report.rank0.json").read_text())


@cache
def _snapshot(name: str) -> Snapshot:
    return load_snapshot(RAW / f"{RUNS[name]}.snapshot.rank0.json.gz")


def _segment_growth(snapshot: Snapshot) -> dict[str, tuple[int, int]]:
    """(bytes, segments) per capture stage from the snapshot's own segment events."""
    out: dict[str, tuple[int, int]] = {}
    for st in analyze(snapshot).stages:
        if st.phase == "capture" and st.pool_growth_bytes:
            out[st.stage] = (st.pool_growth_bytes, st.segments)
    return out


@pytest.mark.parametrize("name", ["A", "B", "C"])
def test_unscaled_replay_reproduces_the_measured_pool(name: str) -> None:
    snap = _snapshot(name)
    g = measured_plan(_report(name))
    trace = pool_trace(snap, g)
    again = replay(trace, g)
    expected = _segment_growth(snap)
    assert expected, "the snapshot has capture-pool growth"
    got = {s: (again.stage_bytes(s), again.segments_by_stage[s]) for s in again.segments_by_stage}
    assert got == expected
    assert again.bytes_by_owner == trace.measured


def test_replay_of_the_eagle_capture_reproduces_its_measured_pools() -> None:
    """Replaying C's own grid gives, stage by stage, the pool growth C's report measured (its
    breakdown's capture-stage rows, written by the analysis of the same start, not by the
    replay): 100 MiB target PIECEWISE, 68 MiB drafter step 0, 24 MiB drafter later steps."""
    trace = pool_trace(_snapshot("C"), measured_plan(_report("C")))
    again = replay(trace, measured_plan(_report("C")))
    measured = {
        s.stage: s.pool_growth_bytes
        for s in _report("C").breakdown.stages  # type: ignore[union-attr]
        if s.phase == "capture" and s.pool_growth_bytes
    }
    assert measured == {
        "target.piecewise": 100 * MiB,
        "draft.step0.piecewise": 68 * MiB,
        "draft.steps.full": 24 * MiB,
    }
    assert {s: again.stage_bytes(s) for s in again.segments_by_stage} == measured


@pytest.mark.parametrize(("g", "g2"), [("A", "B"), ("B", "A")])
def test_what_if_by_replay_matches_the_other_start(g: str, g2: str) -> None:
    truth = _segment_growth(_snapshot(g2))
    rows, notes = pool_predictions(_report(g), measured_plan(_report(g2)), snapshot=_snapshot(g))
    assert notes == []
    predicted = {p.stage: p.predicted_bytes for p in rows}
    assert {p.law for p in rows} == {"allocator_replay"}
    for stage, (measured, _) in truth.items():
        assert abs(predicted[stage] - measured) <= 0.05 * measured
    # Worked by hand from the segments: A 20+2+14+20+2+2+2 MiB, B 2+2+20 MiB.
    assert predicted["target.piecewise"] == {"B": 24 * MiB, "A": 62 * MiB}[g2]
    # The factor column is the row's own G' / G (what the measured bytes were multiplied by).
    for p in rows:
        assert p.measured_bytes > 0
        assert abs(p.factor * p.measured_bytes - p.predicted_bytes) <= 1


def test_what_if_with_snapshot_keeps_the_kv_budget_path() -> None:
    result = what_if(_report("A"), measured_plan(_report("B")), snapshot=_snapshot("A"))
    pool = [p for p in result.owners if p.owner != "graph_objects"]
    assert [(p.owner, p.law, p.predicted_bytes) for p in pool] == [
        ("compiled_piece", "allocator_replay", 24 * MiB)
    ]
    assert result.graph_pool_bytes_to == 24 * MiB
    assert result.kv_budget_bytes_to is not None


def _tiny_snapshot() -> Snapshot:
    """target.full graphs of 2 and 1 requests: 8 / 4 MiB requests plus a constant 512 B one."""
    snap = empty_snapshot()
    tag = "memest/1;phase=capture;stage=target.full;pool=0,1;win={}"
    snap["tags"] = ["", tag.format(1), tag.format(2)]
    snap["actions"] = ["segment_alloc", "alloc", "free_completed"]
    snap["windows"] = [
        {"kind": "capture", "tag": tag.format(w), "window": w, "pool": "0,1", "start_us": w}
        for w in (1, 2)
    ]
    big, small = 1 << 40, 1 << 41
    rows = [  # (action, addr, size, tag)
        (0, big, 20 * MiB, 1),
        (1, big, 8 * MiB, 1),
        (0, small, 2 * MiB, 1),
        (1, small, 512, 1),
        (2, big, 8 * MiB, 1),
        (2, small, 512, 1),
        (1, big, 4 * MiB, 2),
        (1, small, 512, 2),
        (2, big, 4 * MiB, 2),
        (2, small, 512, 2),
    ]
    cols = snap["events"]
    for a, addr, size, t in rows:
        for key, value in zip(
            ("action", "addr", "size", "stream", "time_us", "tag", "stack"),
            (a, addr, size, 7, 0, t, -1),
            strict=True,
        ):
            cols[key].append(value)
    return snap


def _plan(sizes: list[int]) -> CapturePlan:
    return CapturePlan.model_validate(
        {
            "sizing": "vllm-0.33.0",
            "gpu": "NVIDIA H200",
            "sm100": False,
            "max_num_seqs": max(sizes),
            "max_num_batched_tokens": 2048,
            "runners": [
                {
                    "runner": "target.full",
                    "label": "target.full",
                    "graph_mode": "FULL",
                    "q": 1,
                    "graph_count": len(sizes),
                    "sizes": sizes,
                    "unit": "requests",
                    "widest_tokens": max(sizes),
                    "sum_tokens": sum(sizes),
                }
            ],
            "total_graphs": len(sizes),
        }
    )


def test_sizes_outside_grid_g_follow_the_line_through_two_graphs() -> None:
    trace = pool_trace(_tiny_snapshot(), _plan([1, 2]))
    assert trace.measured == {("target.full", "unattributed:<no stack>"): 22 * MiB}
    # G' = 4 requests: the big request is 4 MiB per request -> 16 MiB, >= 10 MiB so a 16 MiB
    # segment; the 512 B request is the same in both graphs, so it stays: one 2 MiB segment.
    # Graph 1 of G' is measured (4 MiB, 512 B) and fits in what graph 4 left free.
    result = replay(trace, _plan([1, 4]))
    assert result.bytes_by_owner == {("target.full", "unattributed:<no stack>"): 18 * MiB}
    assert result.segments_by_stage == {"target.full": 2}
    # G' = 3, beyond G's widest: the same line gives 8 + 4 = 12 MiB, a 12 MiB segment.
    assert replay(trace, _plan([3])).stage_bytes("target.full") == 14 * MiB


def test_snapshot_without_capture_windows_is_named() -> None:
    with pytest.raises(ReportFormatError, match="no CUDA-graph capture windows"):
        pool_trace(empty_snapshot(), _plan([1]), source="empty.json")


def test_snapshot_lacking_a_measured_stage_is_named() -> None:
    snap = copy.deepcopy(_snapshot("A"))
    old, new = "phase=capture;stage=target.piecewise", "phase=capture;stage=renamed"
    snap["tags"] = [t.replace(old, new) for t in snap["tags"]]
    for w in snap["windows"]:
        w["tag"] = str(w.get("tag") or "").replace(old, new)
    with pytest.raises(ReportFormatError, match="stage target.piecewise"):
        pool_predictions(_report("A"), measured_plan(_report("B")), snapshot=snap)


def test_snapshot_of_another_grid_is_named() -> None:
    # B's 363 windows cannot be A's 35 PIECEWISE graphs.
    with pytest.raises(ReportFormatError, match="363 capture windows"):
        pool_predictions(_report("A"), measured_plan(_report("B")), snapshot=_snapshot("B"))


def _cli(tmp_path: Path, snapshot: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    grid = tmp_path / "grid.json"
    grid.write_text(measured_plan(_report("B")).model_dump_json())
    report = RAW / f"{RUNS['A']}.report.rank0.json"
    argv = ["estimate", "--from", str(report), "--grid", str(grid), "--snapshot", str(snapshot)]
    code = main([*argv, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else out.err)


def test_cli_what_if_with_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, payload = _cli(tmp_path, RAW / f"{RUNS['A']}.snapshot.rank0.json.gz", capsys)
    assert code == 0
    laws = {o["owner"]: (o["law"], o["predicted_bytes"]) for o in payload["what_if"]["owners"]}
    assert laws["compiled_piece"] == ("allocator_replay", 24 * MiB)


def test_cli_bad_snapshot_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = RAW / f"{RUNS['B']}.snapshot.rank0.json.gz"
    code, err = _cli(tmp_path, wrong, capsys)
    assert code == 2
    assert "target.piecewise" in err and "Traceback" not in err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    code, err = _cli(tmp_path, broken, capsys)
    assert code == 2
    assert "broken.json" in err

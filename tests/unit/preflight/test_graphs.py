"""The synthetic per-graph trace against the measured traces and pool growth of real starts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from memest.estimate import account
from memest.estimate.poolreplay import pool_trace
from memest.estimate.synthetic_trace import pool_bytes, synthetic_trace
from memest.estimate.terms.shape import model_shape
from memest.estimate.whatif import measured_plan
from memest.schema import RunReport
from memest.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parents[3]
TARGET = model_shape(json.loads((ROOT / "tests/data/configs/llama8b.json").read_text()))
DRAFTER = model_shape(json.loads((ROOT / "tests/data/configs/eagle3_8b.json").read_text()))
RAW = ROOT / "tests/data/starts"
STARTS = [
    "call9.S_llama8b_s128_t4096.apply",
    "call6.B_llama8b_s32_t2048.apply",
    "call6.C_llama8b_eagle3k3_s64_t4096.apply",
    "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply",
]


def _report(path: Path) -> RunReport:
    return RunReport.model_validate_json(path.read_text())


@pytest.mark.parametrize("name", STARTS)
def test_replayed_synthetic_trace_grows_each_stage_as_measured(name: str) -> None:
    report = _report(RAW / f"{name}.report.rank0.json")
    k = report.config.num_speculative_tokens
    plan = measured_plan(report)
    got = pool_bytes(plan, TARGET, DRAFTER if k else None, draft_steps=max(k - 1, 1))
    measured = account(report).terms
    assert measured is not None
    assert got.by_stage == measured.graph_pool_by_stage_bytes


def test_synthetic_requests_are_the_measured_requests_graph_by_graph() -> None:
    start = ROOT / "tests/data/starts/call3.A_llama8b_s128_t4096.enable"
    report = _report(Path(f"{start}.report.rank0.json"))
    plan = measured_plan(report)
    measured = pool_trace(load_snapshot(f"{start}.snapshot.rank0.json.gz"), plan)
    synthetic = synthetic_trace(plan, TARGET)
    for stage, graphs in measured.stages.items():
        ours = {g.size: g for g in synthetic.stages[stage]}
        for g in graphs:
            assert Counter(a.size for a in ours[g.size].allocs) == Counter(
                a.size for a in g.allocs
            ), f"{stage} graph of {g.size}"

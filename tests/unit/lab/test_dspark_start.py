"""The H200 DSpark start (call 30, P_qwen3_8b12l_dspark7_s64_t2048, memest apply with the
allocator history kept): measured graph counts against the capture plan, and the draft logits'
owners and size laws at every captured size.

Data: tests/data/starts/call30.*, copied unchanged from reports/vllm/raw/. Expected counts are
the hand derivation of test_dspark_plan.py (vLLM 0.33.0's sizing, worked by hand); expected
sizes come from the draft's config.json and vLLM's DSpark code (lab/dspark_logits_law.py's
docstring), never from the analysis under test.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from lab.dspark_logits_law import check
from lab.vllm_runs import LAB_MODELS
from memest.analysis import analyze
from memest.schema import Breakdown, RunReport
from memest.snapshot import load_snapshot
from tests.unit.lab.test_dspark_plan import (
    CAPTURE_SIZES,
    DRAFT_BLOCK_REQUESTS,
    TARGET_DECODE_REQUESTS,
)

STARTS = Path(__file__).resolve().parents[2] / "data" / "starts"
RUN = "call30.P_qwen3_8b12l_dspark7_s64_t2048.apply-hist"
REPORT = STARTS / f"{RUN}.report.rank0.json"
SNAPSHOT = STARTS / f"{RUN}.snapshot.rank0.json.gz"
TARGET = json.loads((LAB_MODELS / "qwen3_8b_12l" / "config.json").read_text())
DRAFT = json.loads((LAB_MODELS / "dspark_qwen3_8b_2l" / "config.json").read_text())
K = 7
MiB = 1 << 20


@cache
def _breakdown() -> Breakdown:
    return analyze(load_snapshot(SNAPSHOT))


def _counts(phase: str) -> dict[str, int | None]:
    return {s.stage: s.graph_count for s in _breakdown().stages if s.phase == phase}


def test_measured_graph_counts_match_vllms_plan_in_both_capture_passes() -> None:
    # vLLM splits the target at each of its 12 attention ops: 13 pieces, one CUDA graph per
    # piece and size in the PIECEWISE stage
    pieces = TARGET["num_hidden_layers"] + 1
    want = {
        "target.piecewise": len(CAPTURE_SIZES) * pieces,
        "target.full": len(TARGET_DECODE_REQUESTS),
        "draft.block.full": len(DRAFT_BLOCK_REQUESTS),
    }
    assert want == {"target.piecewise": 51 * 13, "target.full": 48, "draft.block.full": 45}
    for phase in ("graph_profiling", "capture"):
        assert {k: v for k, v in _counts(phase).items() if k in want} == want


def test_the_reports_vllm_plan_is_the_measured_one_and_the_seed_sizing_is_not() -> None:
    report = RunReport.model_validate_json(REPORT.read_text())
    plans = {p.sizing: {r.runner: r.graph_count for r in p.runners} for p in report.capture_plans}
    assert plans["vllm-0.33.0"] == {
        "target.piecewise": 51,
        "target.full": 48,
        "draft.block.full": 45,
    }
    # the seed's five fields size the DSpark block like the target's decode (48 graphs): three
    # graphs more than vLLM captures (ceil(size / 7) skips 9, 17, 25, 33, ... requests)
    assert plans["seed"]["draft.block.full"] == 48
    assert _counts("capture")["draft.block.full"] == 45


def test_draft_logits_follow_their_size_law_at_every_captured_size() -> None:
    lines = check(SNAPSHOT, REPORT, DRAFT, "graph_profiling") + check(
        SNAPSHOT, REPORT, DRAFT, "capture"
    )
    assert len(lines) == 2 * 45
    assert all(line.startswith("ok ") for line in lines), [
        line for line in lines if not line.startswith("ok ")
    ]


def test_draft_logits_live_peaks_are_the_widest_graphs() -> None:
    vocab, hidden = DRAFT["vocab_size"], DRAFT["hidden_size"]
    rows = max(DRAFT_BLOCK_REQUESTS)
    peaks = {
        p.owner: p.peak_bytes
        for p in _breakdown().live_peaks
        if p.stage == "draft.block.full" and p.phase == "capture"
    }
    # the base logits once; a step's bias and logits each live two at a time (step i's while
    # step i + 1's is computed); the gathered hidden states once
    assert peaks["draft_logits"] == rows * K * vocab * 2
    assert peaks["draft_logits.markov_bias"] == 2 * rows * vocab * 2
    assert peaks["draft_logits.step"] == 2 * rows * vocab * 2
    assert peaks["draft_sample_hidden"] == rows * K * hidden * 2
    # the drafter's eager GEMMs left under gemm_workspace: the capture stream's cuBLAS
    # workspace (torch's sm90 default, 8 x 4 MiB) and the fc output (combine_hidden_states) over
    # the graph's 512 tokens (max_cudagraph_capture_size, the widest graph's padded input)
    assert peaks["gemm_workspace"] == 32 * MiB + max(CAPTURE_SIZES) * hidden * 2


def test_the_drafter_stage_is_named() -> None:
    rows = [
        t for t in _breakdown().triggers if t.phase == "capture" and t.stage.startswith("draft")
    ]
    unnamed = [t.owner for t in rows if t.owner.startswith(("unattributed", "compiled_piece"))]
    assert rows and not unnamed

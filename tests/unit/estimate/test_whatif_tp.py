"""A TP change in the what-if's grid moves what TP adds outside PyTorch (memest.estimate.parallel).

Driven by a real TP=1 report (Llama-8B shape, hidden 4096, an H200: reports/vllm call 8); the
expected bytes are worked out by hand from NCCL 2.30's and vLLM 0.33.0's defaults.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memest.estimate import what_if
from memest.schema import RunReport

REPORT_PATH = (
    Path(__file__).resolve().parents[2]
    / "data/reports/call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json"
)
MiB = 1 << 20
# TP=2, sm90: NCCL 24 channels x 12 MiB = 288 MiB; custom all-reduce 10 + 16 MiB;
# symmetric memory 66 MiB; FlashInfer 128 + 2 + 384 MiB. rank_data 8 MiB is a torch tensor.
TP2_OUTSIDE = (288 + 26 + 66 + 514) * MiB


@pytest.fixture(scope="module")
def report() -> RunReport:
    return RunReport.model_validate_json(REPORT_PATH.read_text())


def test_tp_change_moves_the_outside_term_and_says_what_it_leaves(report: RunReport) -> None:
    assert report.config.tensor_parallel_size == 1
    # no model dimensions recorded: FlashInfer's share is its 64 MiB maximum, which hidden 4096
    # fills exactly (8192 rows of 8192 B)
    assert report.config.model_dims is None
    result = what_if(report, {"tensor_parallel_size": 2})
    a, b = result.terms_from, result.terms_to
    assert a is not None and b is not None
    assert b.outside_torch_bytes - a.outside_torch_bytes == TP2_OUTSIDE
    assert b.baseline_torch_bytes - a.baseline_torch_bytes == 8 * MiB
    assert b.weights_bytes == a.weights_bytes  # not moved: the note says so
    assert "memest.estimate.parallel" in result.term_laws["outside_torch_bytes"]
    assert any("only what TP adds outside PyTorch moves" in n for n in result.notes)
    moved = TP2_OUTSIDE + 8 * MiB
    assert result.kv_budget_bytes_from - result.kv_budget_bytes_to == moved  # type: ignore[operator]


def test_same_tp_moves_nothing(report: RunReport) -> None:
    result = what_if(report, {"tensor_parallel_size": 1, "max_num_seqs": 64})
    assert not any("tensor_parallel_size" in n for n in result.notes)
    assert "NCCL" not in result.term_laws.get("outside_torch_bytes", "")

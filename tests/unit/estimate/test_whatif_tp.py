"""A TP change in the what-if's grid moves what TP adds outside PyTorch (memest.estimate.parallel).

Driven by a real TP=1 report (Llama-8B shape, hidden 4096, an H200: reports/vllm call 8); the
expected bytes are worked out by hand from NCCL 2.30's and vLLM 0.33.0's defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.estimate import what_if
from memest.estimate.runner_buffers import ModelDims
from memest.schema import RunReport

CONFIGS = Path(__file__).resolve().parents[2] / "data/configs"
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
    assert "memest.estimate.parallel" in result.term_laws["outside_torch_bytes"]
    assert any("only what TP adds outside PyTorch moves" in n for n in result.notes)


#: Llama-3-8B (tests/data/configs/llama8b.json: hidden 4096, intermediate 14336, 32 layers,
#: 32 query and 8 KV heads of 128, vocab 128,256, untied, bf16), parameters per layer:
#: qkv 4096 x (4096 + 2 x 1024) = 25,165,824; o 4096 x 4096 = 16,777,216; gate_up
#: 4096 x 2 x 14336 = 117,440,512; down 14336 x 4096 = 58,720,256; two norms 8,192; so
#: 218,112,000 x 32 = 6,979,584,000, plus embed and lm_head 2 x 128,256 x 4096 = 1,050,673,152
#: and the final norm 4,096: 8,030,261,248. At TP=2 vLLM splits every linear layer and the
#: vocab-parallel embed and lm_head (128,256 / 2 = 64,128, already a multiple of 64) in half and
#: replicates the 32 x 8,192 + 4,096 = 266,240 norm weights: a rank holds
#: (8,030,261,248 - 266,240) / 2 + 266,240 = 4,015,263,744 parameters. In bf16 the weights
#: term drops by 2 x (8,030,261,248 - 4,015,263,744) = 8,029,995,008 B.
TP2_WEIGHTS_DROP = 2 * (8_030_261_248 - 4_015_263_744)


def test_tp_change_halves_the_weights_but_the_norms(report: RunReport) -> None:
    config = json.loads((CONFIGS / "llama8b.json").read_text())
    dims = ModelDims.from_report(report, config)
    result = what_if(report, {"tensor_parallel_size": 2}, dims=dims)
    a, b = result.terms_from, result.terms_to
    assert a is not None and b is not None
    assert a.weights_bytes - b.weights_bytes == TP2_WEIGHTS_DROP


def test_same_tp_moves_nothing(report: RunReport) -> None:
    result = what_if(report, {"tensor_parallel_size": 1, "max_num_seqs": 64})
    assert not any("tensor_parallel_size" in n for n in result.notes)
    assert "NCCL" not in result.term_laws.get("outside_torch_bytes", "")

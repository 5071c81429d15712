"""The what-if moves TRITON_MLA's split-KV decode logits (memest.estimate.terms.mla_decode) in
the profiling residue with max_num_seqs and max_model_len, by the decode backend the report
records; a report without one keeps them and says so."""

from __future__ import annotations

import json
from pathlib import Path

from memest.estimate import what_if
from memest.estimate.runner_buffers import ModelDims
from memest.schema import RunReport

ROOT = Path(__file__).resolve().parents[3]
# H200 call 42: a DeepSeek-V2-class MLA model with 64 heads (kv_lora_rank 256), all 8 layers
# dense, at 64 seqs / 2,048 tokens / max_model_len 4,096, TRITON_MLA decode
REPORT = ROOT / "tests/data/reports/call42.K_mla64h8l_s64_t2048_fa.apply.report.rank0.json"
CONFIG = json.loads((ROOT / "tests/data/configs/mla64h_kv256_8l.json").read_text())
GRID = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "max_model_len": 8192}


def _residue_to(backend: str | None) -> tuple[int, list[str]]:
    report = RunReport.model_validate_json(REPORT.read_text())
    config = report.config.model_copy(update={"mla_decode_backend": backend})
    report = report.model_copy(update={"config": config})
    w = what_if(report, GRID, dims=ModelDims.from_report(report, CONFIG))
    assert w.terms_to is not None
    return w.terms_to.profiling_residue_bytes, w.notes


def test_triton_mla_logits_move_with_the_grid() -> None:
    # (seqs x heads x splits x (kv_lora_rank + 1)) float32; splits = next_pow2(max_model_len /
    # 512): 8 at 4,096, 16 at 8,192 (below 2 x 132 SMs)
    at_g = 64 * 64 * 8 * 257 * 4
    at_to = 1024 * 64 * 16 * 257 * 4
    moved, notes = _residue_to("TRITON_MLA")
    kept, kept_notes = _residue_to(None)
    assert moved - kept == at_to - at_g == 1_044_250_624
    assert any("TRITON_MLA's split-KV decode logits" in n for n in notes)
    assert any("MLA decode backend not recorded" in n for n in kept_notes)


def test_another_decode_backend_reserves_no_logits() -> None:
    flashmla, _ = _residue_to("FLASHMLA")
    kept, _ = _residue_to(None)
    assert flashmla == kept

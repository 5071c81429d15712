"""Grid-sized runner buffers of vLLM 0.33.0, against sizes worked out by hand from its source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.errors import ConfigError
from memest.estimate import full_init_terms, what_if
from memest.estimate.runner_buffers import (
    BUFFER_TERMS,
    ModelDims,
    RunnerGrid,
    runner_buffer_bytes,
    term_bytes,
)
from memest.schema import RunReport
from memest.units import MiB

LLAMA8B = {"hidden_size": 4096, "vocab_size": 128256, "torch_dtype": "bfloat16"}


def test_penalties_are_seqs_by_vocab_int32_plus_the_prompt_bit_mask() -> None:
    dims = ModelDims.from_hf_config(LLAMA8B)
    grid = RunnerGrid(max_num_seqs=128, max_num_batched_tokens=4096, max_model_len=4096)
    # output_bin_counts 128 x 128256 x 4 B; prompt_bin_mask 128 x 4008 words x 4 B
    assert runner_buffer_bytes(dims, grid)["penalties"] == 65_667_072 + 2_052_096


def test_topk_buffer_rows_are_the_next_power_of_two_capped_at_the_sms() -> None:
    dims = ModelDims.from_hf_config(LLAMA8B)

    def rows(seqs: int) -> int:
        grid = RunnerGrid(max_num_seqs=seqs, max_num_batched_tokens=4096, max_model_len=4096)
        return runner_buffer_bytes(dims, grid)["topk_topp_buffer"] // (128256 * 4)

    assert [rows(s) for s in (32, 96, 128, 256)] == [32, 128, 128, 132]


def test_drafter_hidden_states_follow_batched_tokens_and_drafter_width() -> None:
    dims = ModelDims.from_hf_config(LLAMA8B, drafter={"hidden_size": 2048})
    grid = RunnerGrid(
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        max_model_len=4096,
        num_speculative_tokens=3,
        speculative_method="eagle3",
    )
    out = runner_buffer_bytes(dims, grid)
    assert out["drafter_hidden_states"] == 4096 * 2048 * 2
    no_drafter = RunnerGrid(max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=4096)
    assert "drafter_hidden_states" not in runner_buffer_bytes(dims, no_drafter)
    # K=3: four logits rows per request in the structured-output bit mask
    assert out["structured_outputs"] == 64 * 4 * 4 + 64 * 4 * 4008 * 4


def test_every_buffer_is_charged_to_a_term_and_terms_sum_to_the_buffers() -> None:
    dims = ModelDims.from_hf_config(LLAMA8B)
    grid = RunnerGrid(
        max_num_seqs=96,
        max_num_batched_tokens=4096,
        max_model_len=4096,
        num_speculative_tokens=5,
        speculative_method="eagle3",
    )
    buffers = runner_buffer_bytes(dims, grid)
    assert set(buffers) <= set(BUFFER_TERMS)
    assert sum(term_bytes(dims, grid).values()) == sum(buffers.values())
    assert all(b % 512 == 0 for b in buffers.values())


def test_a_config_without_vocab_is_named() -> None:
    with pytest.raises(ConfigError, match="vocab_size"):
        ModelDims.from_hf_config({"hidden_size": 4096})


RAW = Path(__file__).resolve().parents[3] / "tests" / "data" / "starts"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _real(name: str) -> RunReport:
    return RunReport.model_validate_json((RAW / f"{name}.report.rank0.json").read_text())


def test_what_if_moves_load_time_terms_as_a_real_start_at_the_other_grid_measured() -> None:
    s = _real("call9.S_llama8b_s128_t4096.apply")  # 128 seqs, 4,096 tokens
    b = _real("call5.B_llama8b_s32_t2048.apply")  # 32 seqs, 2,048 tokens
    dims = ModelDims.from_report(s, json.loads((EXAMPLES / "llama8b.config.json").read_text()))
    result = what_if(s, {"max_num_seqs": 32, "max_num_batched_tokens": 2048}, dims=dims)
    assert result.terms_to is not None and result.terms_from is not None
    measured = full_init_terms(b)
    # weights phase: 52.9 MiB less at B; profiling residue: 48.2 MiB less (real H200 starts)
    for term, tolerance in (("weights_bytes", 4 * MiB), ("profiling_residue_bytes", 2 * MiB)):
        moved = getattr(result.terms_from, term) - getattr(result.terms_to, term)
        assert moved > 40 * MiB, term
        assert abs(getattr(result.terms_to, term) - getattr(measured, term)) < tolerance, term
    assert "penalties" in result.term_laws["weights_bytes"]
    assert "topk_topp_buffer" in result.term_laws["profiling_residue_bytes"]
    # graph objects: 178 MiB outside PyTorch for 54 graphs at S, 54 MiB for 18 at B
    assert abs(result.terms_to.outside_torch_bytes - measured.outside_torch_bytes) < 8 * MiB


def test_without_dims_the_buffer_terms_are_kept_and_the_note_says_so() -> None:
    s = _real("call9.S_llama8b_s128_t4096.apply")
    result = what_if(s, {"max_num_seqs": 32})
    assert result.terms_to is not None and result.terms_from is not None
    assert result.terms_to.weights_bytes == result.terms_from.weights_bytes
    assert any("model's config.json" in n for n in result.notes)

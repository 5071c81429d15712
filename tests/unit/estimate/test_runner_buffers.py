"""Grid-sized runner buffers of vLLM 0.33.0, against sizes worked out by hand from its source."""

from __future__ import annotations

import pytest

from memest.errors import ConfigError
from memest.estimate.runner_buffers import (
    BUFFER_TERMS,
    ModelDims,
    RunnerGrid,
    runner_buffer_bytes,
    term_bytes,
)

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

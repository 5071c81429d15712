"""The full-batch sampler's reserve: what its vocabulary-wide tensors add over the forward's
freed segments, by the caching allocator's rules (hand-derived segment arithmetic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.estimate.model_shape import model_shape
from memest.estimate.sampler import (
    PROMPT_LOGPROBS_CHUNK_ROWS,
    forward_free_segments,
    prompt_logprobs_rows,
    sampler_reserve_bytes,
    sampler_rows,
    serving_step_reserve_bytes,
)

ROOT = Path(__file__).resolve().parents[3]
LLAMA = model_shape(json.loads((ROOT / "tests/data/configs/llama8b.json").read_text()))
GEMMA = model_shape(json.loads((ROOT / "tests/data/configs/gemma3_6l.json").read_text()))
MiB = 1 << 20


def test_rows_are_one_per_dummy_request() -> None:
    assert sampler_rows(1024, 8192) == 1024
    assert sampler_rows(1024, 512) == 512  # fewer tokens than seqs: one token per request


def test_at_vllm_serve_defaults_the_float32_copy_takes_a_segment() -> None:
    # 1,024 x 128,256 logits: bf16 256.5 MiB fits the freed gate_up block of 8,192 x 28,672 x 2
    # (448 MiB); the float32 copy (513 MiB) fits no freed block and reserves its own segment,
    # rounded up to 2 MiB. The default-flags starts: 1.648 GiB headroom, 1.157 from the forward.
    fp32 = 1024 * 128256 * 4
    assert max(forward_free_segments(LLAMA, 8192)) == 8192 * 28672 * 2
    assert sampler_reserve_bytes(LLAMA, 1024, 8192) == -(-fp32 // (2 * MiB)) * 2 * MiB


def test_at_a_few_hundred_rows_the_freed_forward_holds_the_sampler_not_the_prompt_chunk() -> None:
    # 128 rows: bf16 31.3 MiB and float32 62.6 MiB fit freed blocks of 4,096 tokens
    # (hidden-wide 32 MiB, the activation 112 MiB); a prompt-logprobs chunk of 1,024 rows,
    # 1,024 x 128,256 x 2 = 250.5 MiB, fits none (gate_up: 4,096 x 28,672 x 2 = 224 MiB) and
    # reserves its own segment, rounded up to 2 MiB
    chunk = 1024 * 128256 * 2
    assert max(forward_free_segments(LLAMA, 4096)) == 4096 * 28672 * 2 < chunk
    assert serving_step_reserve_bytes(LLAMA, 128, 4096) == 252 * MiB
    assert sampler_reserve_bytes(LLAMA, 128, 4096) == 252 * MiB  # the sampler itself adds 0


def test_at_vllm_serve_defaults_the_prompt_chunk_takes_the_freed_float32_copy() -> None:
    # the 250.5 MiB chunk comes after the sampler's tensors are freed: the 502 MiB segment of the
    # float32 copy (and the 448 MiB gate_up block) holds it
    assert serving_step_reserve_bytes(LLAMA, 1024, 8192) == 0


def test_a_gemma3_vocabulary_chunk_needs_half_a_gib() -> None:
    # 1,024 x 262,144 x 2 = 512 MiB against freed blocks of at most 4,096 x 20,480 x 2 = 160 MiB;
    # the H200 Gemma-3-class start's full-batch step (896 prompt rows: 448 MiB) grew PyTorch's
    # reservation 0.438 GiB beyond its first full-size step (reports/vllm/README.md, call 47)
    assert max(forward_free_segments(GEMMA, 4096)) == 4096 * 20480 * 2
    assert serving_step_reserve_bytes(GEMMA, 128, 4096) == 512 * MiB
    assert serving_step_reserve_bytes(GEMMA, 128, 4096) - 896 * 262144 * 2 == 64 * MiB


def test_a_step_narrower_than_a_chunk_scores_its_own_tokens() -> None:
    assert prompt_logprobs_rows(512) == 512
    assert prompt_logprobs_rows(8192) == PROMPT_LOGPROBS_CHUNK_ROWS == 1024


@pytest.mark.vllm
def test_the_chunk_is_vllms_own() -> None:
    prompt_logprob = pytest.importorskip("vllm.v1.worker.gpu.sample.prompt_logprob")
    assert prompt_logprob.CHUNK_SIZE == PROMPT_LOGPROBS_CHUNK_ROWS

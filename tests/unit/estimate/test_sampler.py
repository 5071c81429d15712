"""The full-batch sampler's reserve: what its vocabulary-wide tensors add over the forward's
freed segments, by the caching allocator's rules (hand-derived segment arithmetic)."""

from __future__ import annotations

import json
from pathlib import Path

from memest.estimate.model_shape import model_shape
from memest.estimate.sampler import forward_free_segments, sampler_reserve_bytes, sampler_rows

ROOT = Path(__file__).resolve().parents[3]
LLAMA = model_shape(json.loads((ROOT / "tests/data/configs/llama8b.json").read_text()))
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


def test_at_a_few_hundred_rows_the_freed_forward_holds_the_sampler() -> None:
    # 128 rows: bf16 31.3 MiB and float32 62.6 MiB fit freed blocks of 4,096 tokens
    # (hidden-wide 32 MiB, the activation 112 MiB)
    assert sampler_reserve_bytes(LLAMA, 128, 4096) == 0

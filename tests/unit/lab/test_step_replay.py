"""lab/step_replay.py on the committed H200 records: the allocator model reproduces the M step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab import step_replay

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20


@pytest.fixture(scope="module")
def moe() -> dict[str, Any]:
    result: dict[str, Any] = step_replay.moe_replay()
    return result


def test_step_replayed_from_the_end_of_init_state_is_the_measured_step(
    moe: dict[str, Any],
) -> None:
    step = moe["with_standins"]["step_from_end_of_init"]
    assert step["reserved_bytes"] == 379_584_512  # results.call14.jsonl step_reserved_growth
    assert step["segments_mib"] == moe["measured"]["step_segments_mib"]


def test_warm_pass_from_the_same_state_needs_what_the_step_needed(moe: dict[str, Any]) -> None:
    """Same requests (allocated peak within 0.1 MB), the gap is the starting state's."""
    w = moe["with_standins"]
    assert (
        w["warm_from_end_of_init"]["reserved_bytes"] == w["step_from_end_of_init"]["reserved_bytes"]
    )
    assert w["warm_from_empty"]["reserved_bytes"] < w["step_from_end_of_init"]["reserved_bytes"]
    peaks = [w[k]["allocated_peak_bytes"] for k in ("warm_from_empty", "step_from_end_of_init")]
    assert abs(peaks[0] - peaks[1]) < 200_000


def test_without_the_standins_the_warm_pass_covers_the_step(moe: dict[str, Any]) -> None:
    wo = moe["without_standins"]
    assert wo["step_from_end_of_init"]["reserved_bytes"] <= wo["warm_from_empty"]["reserved_bytes"]
    assert abs(moe["would_have_been"]["usage_minus_budget_without_standins_bytes"]) < 0.1 * 2**30


def test_cpu_sdpa_prefill_arithmetic() -> None:
    sizes = step_replay.cpu_sdpa_prefill(2048, 16, 192, 128)
    assert sizes["scores"] == 256 * MiB  # 16 x 2048^2 float32
    assert sizes["q_or_k_f32"] == 24 * MiB and sizes["v_f32"] == 16 * MiB
    dummy = step_replay.profile_dummy(4096, 64, 16, 16, 128, 128)
    assert dummy == 256 * MiB  # 32,768 workspace rows x 16 heads x 256 x bf16

"""The DSpark start's warm profile pass replayed without the drafter's block routine
(lab/warm_pass_replay.py): a replay of call 30's kept history, not a start.

Expected figures come from vLLM's DSpark code and the allocator's rules by hand, and from the
harness's own record of the start (tests/data/starts/results.call30.P_apply-hist.jsonl, its
apply-hist line of reports/vllm/raw/results.call30.jsonl, copied unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.warm_pass_replay import figures
from memest.units import GiB

STARTS = Path(__file__).resolve().parents[2] / "data" / "starts"
RUN = "call30.P_qwen3_8b12l_dspark7_s64_t2048.apply-hist"
RESULTS = STARTS / "results.call30.P_apply-hist.jsonl"
MiB = 1 << 20


def _figures() -> dict[str, int]:
    return figures(
        STARTS / f"{RUN}.snapshot.rank0.json.gz",
        STARTS / f"{RUN}.report.rank0.json",
        RESULTS,
        "apply-hist",
    )


def test_the_draft_block_reserved_one_segment_for_the_base_draft_logits() -> None:
    out = _figures()
    # DSpark's lm_head over 64 requests x K = 7 positions x 151,936 tokens x 2 B = 136,134,656 B;
    # a request of 10 MiB or more gets a segment of itself rounded up to 2 MiB: 65 x 2 MiB
    assert out["segments_reserved_in_draft_block_bytes"] == 65 * 2 * MiB
    assert out["warm_pass_reserved_bytes"] == out["activation_term_bytes"]
    # the allocator model's two replays differ by exactly that segment
    assert (
        out["replay_as_recorded_bytes"] - out["replay_without_draft_block_bytes"]
        == out["segments_reserved_in_draft_block_bytes"]
    )


def test_the_replayed_budget_is_within_a_tenth_of_a_gib_at_servings_peak() -> None:
    out = _figures()
    row = json.loads(RESULTS.read_text())
    # as started: the harness's own figure for the larger of its two serving steps
    started = max(
        row["step_usage_minus_budget_bytes"], row["context_step_usage_minus_budget_bytes"]
    )
    assert out["serving_peak_minus_budget_bytes"] == started
    assert started < -0.1 * GiB
    # replayed: the KV budget grows by the segment, in whole blocks of 917,504 B (14 layers x 16
    # tokens x 8 KV heads x 128 x 2 B x 2): 148 of them and the budget's remainder, or 149
    page = 14 * 16 * 8 * 128 * 2 * 2
    assert out["kv_blocks_replay"] - out["kv_blocks"] in (
        65 * 2 * MiB // page,
        65 * 2 * MiB // page + 1,
    )
    assert abs(out["replay_serving_peak_minus_budget_bytes"]) < 0.1 * GiB

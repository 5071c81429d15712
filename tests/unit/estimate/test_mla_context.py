"""MLA's prefill up-projection (memest.estimate.mla_context) against vLLM 0.33.0's sizing rule
and the H200 measurements of reports/vllm (calls 17-21)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.estimate.accounting import account
from memest.estimate.mla_context import (
    chunked_prefill_workspace_tokens,
    mla_context_bytes,
    profile_standin_bytes,
    replay_context_step,
    run_mla_context_bytes,
    second_chunk_bytes,
    up_projection_tensors,
)
from memest.estimate.model_shape import model_shape
from memest.schema import ModelShape as RecordedShape
from memest.schema import RunConfig, RunReport
from tests.starts import harness_record

ROOT = Path(__file__).resolve().parents[3]
DSV2 = json.loads((ROOT / "lab/models/dsv2lite_8l/config.json").read_text())
DSV3 = json.loads((ROOT / "lab/models/dsv3_5l/config.json").read_text())
LLAMA = json.loads((ROOT / "examples/llama8b.config.json").read_text())
RAW = ROOT / "tests/data/starts"
MiB = 1 << 20
GiB = 1 << 30


@pytest.mark.parametrize(
    ("max_model_len", "max_num_seqs", "block_size", "tokens"),
    [
        (4096, 64, 16, 8 * 4096),  # eight full-length requests
        (256, 1024, 16, 4 * 1024 * 16),  # at least four pages per request
        (16384, 64, 16, 64 * 1024),  # capped at 64k tokens
        (1024, 16, 64, 8 * 1024),
    ],
)
def test_workspace_follows_vllms_rule(
    max_model_len: int, max_num_seqs: int, block_size: int, tokens: int
) -> None:
    """min(max(8 x max_model_len, 4 x max_num_seqs x block_size), 64 x 1024), as
    MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size writes it."""
    assert chunked_prefill_workspace_tokens(max_model_len, max_num_seqs, block_size) == tokens


def test_chunk_is_what_the_h200_reserved_over_the_first_step() -> None:
    """Call 17, DeepSeek-V2-Lite's shape with FA2 (v padded), memest apply: the step over cached
    context reserved 640 MiB more than the first full-size step of the same start."""
    rec = harness_record("call17", "L_dsv2lite8l_s64_t2048_fa", "apply-hist")
    measured = rec["context_step_usage_bytes"] - rec["step_usage_bytes"]
    shape = model_shape(DSV2)
    tokens = chunked_prefill_workspace_tokens(4096, 64, 16)
    chunk = up_projection_tensors(shape, tokens, v_padded=True)
    assert set(chunk) == {"kv_nope", "k", "v_padded"}
    assert sum(chunk.values()) == measured == 640 * MiB


def test_the_steps_own_up_projection_is_what_the_first_step_reserved_beyond_the_warm_pass() -> None:
    """Call 19: memest's warm profile pass ran without vLLM's stand-in; serving's first full-size
    step (2,047 tokens, 2,048 batched) reserved exactly 40 MiB more than that pass: the bytes of
    the three up-projected tensors of the step's own prefill (its history: kv_nope, padded v and
    the attention output, which has k's size, in segments of their own)."""
    rec = harness_record("call19", "L_dsv2lite8l_s64_t2048_fa", "apply-hist-stephist")
    warm = rec["memest_figures"]["profile_headroom_bytes"]
    measured = rec["step_reserved_growth_bytes"] - warm
    tensors = up_projection_tensors(model_shape(DSV2), 2048, v_padded=True)
    assert sum(tensors.values()) == measured == 40 * MiB


def test_the_term_is_step_and_chunk_less_the_stand_in_the_headroom_holds() -> None:
    shape = model_shape(DSV2)
    tokens = chunked_prefill_workspace_tokens(4096, 64, 16)
    chunk = up_projection_tensors(shape, tokens, v_padded=True)
    step = up_projection_tensors(shape, 2048, v_padded=True)
    # by hand (test_a_run_config_gives_the_term_from_its_recorded_dimensions): chunk 256 + 192 +
    # 192 MiB, step 16 + 12 + 12 MiB, stand-in 256 MiB
    assert chunk == {"kv_nope": 256 * MiB, "k": 192 * MiB, "v_padded": 192 * MiB}
    assert step == {"kv_nope": 16 * MiB, "k": 12 * MiB, "v_padded": 12 * MiB}
    assert profile_standin_bytes(shape, tokens) == chunk["kv_nope"] == 256 * MiB
    held = mla_context_bytes(shape, tokens, 2048, v_padded=True)
    assert held == chunk["k"] + chunk["v_padded"] + sum(step.values()) == 424 * MiB
    # memest's warm pass runs without the stand-in: the whole chunk counts
    whole = mla_context_bytes(shape, tokens, 2048, v_padded=True, standin_in_headroom=False)
    assert whole == sum(chunk.values()) + sum(step.values()) == 680 * MiB
    # FlashAttention 3 and 4 take v as it is: no padded v
    fa3 = mla_context_bytes(shape, tokens, 2048, v_padded=False)
    assert fa3 == chunk["k"] + step["kv_nope"] + step["k"] == 220 * MiB
    assert held > fa3 > 0


def test_models_without_mla_have_no_term() -> None:
    shape = model_shape(LLAMA)
    assert mla_context_bytes(shape, 32768, 2048, v_padded=True) == 0
    assert profile_standin_bytes(shape, 32768) == 0
    assert up_projection_tensors(shape, 32768, v_padded=True) == {}


def test_a_run_config_gives_the_term_from_its_recorded_dimensions() -> None:
    """DeepSeek-V2-Lite's attention (lab/models/dsv2lite_8l/config.json: 16 heads, qk_nope 128,
    qk_rope 64, v 128, bfloat16), max_model_len 4,096, 64 sequences, 2,048 batched tokens, pages
    of 16. By hand from vLLM 0.33.0's rules:
    - chunk: min(max(8 x 4,096, 4 x 64 x 16), 64 x 1,024) = 32,768 tokens; one head-row of all 16
      heads in bf16 is 16 x 2 = 32 B, so 32,768 tokens x 32 B = 1 MiB per element of head_dim:
      kv_nope [qk_nope + v = 256] 256 MiB, k [qk_nope + qk_rope = 192] 192 MiB, padded v 192 MiB
      (their sum, 640 MiB, is what call 17 measured);
    - the step's own prefill: 2,048 tokens x 32 B = 64 KiB per element: kv_nope 16 MiB, k 12 MiB,
      padded v 12 MiB (40 MiB, call 19's measurement);
    - the profile run's stand-in vLLM's headroom holds: the chunk's kv_nope, 256 MiB (a multiple
      of 2 MiB, so the allocator reserves it as it is);
    - the activation headroom holds a serving step's prompt-logprobs chunk, 1,024 rows x 102,400
      x 2 B = 200 MiB (no freed block of a 2,048-token forward holds it): the prefill over context
      needs only what lies beyond it.
    """
    dims = RecordedShape.model_validate(
        {k: v for k, v in DSV2.items() if k in RecordedShape.model_fields}
    )
    base = RunConfig(
        model="dsv2",
        max_model_len=4096,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        model_dims=dims,
    )
    # FlashAttention 2 pads v; when the report does not say, memest assumes the larger:
    # the chunk's k and padded v, the step's three tensors, the stand-in already in the headroom.
    chunk = 1024 * 102400 * 2
    assert chunk == 200 * MiB
    unknown = run_mla_context_bytes(base, 16)
    assert unknown == (192 + 192) * MiB + (16 + 12 + 12) * MiB - chunk == 224 * MiB
    # FlashAttention 3 and 4 take v as it is: the chunk's kv_nope and k less the stand-in
    # (256 + 192 - 256), and the step's kv_nope and k.
    fa3 = base.model_copy(update={"mla_prefill_v_padded": False})
    assert run_mla_context_bytes(fa3, 16) == (256 + 192 - 256) * MiB + (16 + 12) * MiB - chunk
    # memest's warm pass ran without the stand-in: the whole 640 MiB chunk and the 40 MiB step
    warm = base.model_copy(update={"mla_warm_pass_without_standin": True})
    assert run_mla_context_bytes(warm, 16) == (640 + 40) * MiB - chunk == unknown + 256 * MiB
    assert run_mla_context_bytes(base.model_copy(update={"model_dims": None}), 16) == 0
    assert run_mla_context_bytes(base.model_copy(update={"max_model_len": None}), 16) == 0


@pytest.mark.parametrize(
    ("call", "mode"),
    [
        ("call19", "apply-hist-stephist"),  # without it, sized without the step's own tensors
        ("call21", "apply"),  # without it, sized with today's term
    ],
)
def test_accounting_of_the_mla_start_lands_on_its_measured_serving_peak(
    call: str, mode: str
) -> None:
    """The accounting's usage minus budget (end of init + headroom + the term) against the usage
    each start measured at its peak (a full-size step, then a step over cached context). (Call
    18's warm pass still ran vLLM's stand-in, which took two 256 MiB segments: its accounting
    reads 0.11 GiB above its peak; reports/vllm/README.md.)"""
    report = RunReport.model_validate_json(
        (RAW / f"{call}.L_dsv2lite8l_s64_t2048_fa.{mode}.report.rank0.json").read_text()
    )
    acc = account(report)
    assert acc.terms is not None and acc.terms.mla_context_bytes > 0
    assert acc.usage_kind == "end_of_init_plus_first_step_and_context_chunk"
    assert acc.usage_minus_budget_bytes is not None
    rec = harness_record(call, "L_dsv2lite8l_s64_t2048_fa", mode)
    peak = max(rec["step_usage_minus_budget_bytes"], rec["context_step_usage_minus_budget_bytes"])
    assert abs(acc.usage_minus_budget_bytes - peak) <= GiB // 10


def test_the_start_sized_with_the_term_is_within_a_tenth_of_a_gib_at_its_peak() -> None:
    """Call 21: memest apply with the up-projection term and the stand-in-free warm pass."""
    rec = harness_record("call21", "L_dsv2lite8l_s64_t2048_fa", "apply")
    peak = max(rec["step_usage_minus_budget_bytes"], rec["context_step_usage_minus_budget_bytes"])
    assert abs(peak) <= GiB // 10
    alone = harness_record("call21", "L_dsv2lite8l_s64_t2048_fa", "alone")
    assert alone["context_step_usage_minus_budget_bytes"] > GiB  # vLLM's own, beside it


def test_the_what_if_resizes_the_term_with_the_workspace() -> None:
    """At 1,024 seqs vLLM's workspace is 4 x 1,024 x 16 = 65,536 tokens, twice 8 x 4,096: the
    chunk doubles (640 MiB more, the chunk call 17 measured), the step's own tensors stay; a grid
    that keeps the workspace keeps the term. The batch step at 1,024 rows reserves a bf16 and a
    float32 logits tensor of 1,024 x 102,400 (200 + 400 MiB, no freed forward block of 2,048
    tokens holds either), which the activation headroom holds: the prefill over context needs
    only what lies beyond it (transients of two steps combine by max). At 64 seqs the headroom
    holds the prompt-logprobs chunk, 1,024 x 102,400 x 2 B = 200 MiB; at 1,024 seqs the chunk
    takes the freed bf16 logits' block and adds nothing."""
    from memest.estimate import what_if

    report = RunReport.model_validate_json(
        (RAW / "call21.L_dsv2lite8l_s64_t2048_fa.apply.report.rank0.json").read_text()
    )
    wide = what_if(report, {"max_num_seqs": 1024})
    assert wide.terms_to is not None and wide.terms_from is not None
    sampler, chunk = 1024 * 102400 * (2 + 4), 1024 * 102400 * 2
    assert sampler == 600 * MiB
    moved = wide.terms_to.mla_context_bytes - wide.terms_from.mla_context_bytes
    assert moved == 640 * MiB - (sampler - chunk)
    assert (
        wide.terms_to.profile_peak_activation_bytes - wide.terms_from.profile_peak_activation_bytes
        == sampler - chunk
    )
    assert "mla_context_bytes" in wide.term_laws
    same = what_if(report, {"max_num_seqs": 32})
    assert same.terms_to is not None and same.terms_from is not None
    assert same.terms_to.mla_context_bytes == same.terms_from.mla_context_bytes


# --------------------------------------------------------------------------- any head count
DSV3 = json.loads((ROOT / "lab/models/dsv3_5l/config.json").read_text())
MLA64 = json.loads((ROOT / "lab/models/mla64h_kv256_8l/config.json").read_text())


def test_the_128_head_shape_by_hand() -> None:
    """DeepSeek-V3's attention (128 heads, nope 128, rope 64, v 128, bf16), max_model_len 4,096 and
    64 sequences: the workspace holds 8 x 4,096 = 32,768 rows. By hand, FA2: kv_nope 32,768 x 128
    x 256 x 2 B = 2 GiB, k and padded v 32,768 x 128 x 192 x 2 B = 1.5 GiB each; the step's 2,048
    tokens 128 MiB + 2 x 96 MiB. Every one is >= 10 MiB and a multiple of 2 MiB: its own segment.
    FA3 (no padded v): 2 + 1.5 GiB and 128 + 96 MiB."""
    shape = model_shape(DSV3)
    tokens = chunked_prefill_workspace_tokens(4096, 64, 64)
    assert tokens == 32768
    fa2 = mla_context_bytes(shape, tokens, 2048, v_padded=True, standin_in_headroom=False)
    assert fa2 == 5 * GiB + (128 + 2 * 96) * MiB
    fa3 = mla_context_bytes(shape, tokens, 2048, v_padded=False, standin_in_headroom=False)
    assert fa3 == 3 * GiB + GiB // 2 + (128 + 96) * MiB
    # the profile run's stand-in [32,768, 128, 256] bf16 = 2 GiB, where the headroom holds it
    held = mla_context_bytes(shape, tokens, 2048, v_padded=True)
    assert fa2 - held == profile_standin_bytes(shape, tokens) == 2 * GiB


def test_the_lab_context_step_adds_nothing_for_its_short_second_chunk_under_fa2() -> None:
    """The lab's context step: 17 requests x 2,032 cached tokens = 34,544 rows, chunks of 32,768
    and 1,776. The second chunk's kv_nope (1,776 x 128 x 256 x 2 B = 111 MiB) is allocated while
    the first chunk's kv_nope and k are still referenced, and finds the first chunk's freed
    padded v (1.5 GiB); its k then takes the freed first kv_nope. Nothing large beyond one chunk:
    the 272 query tokens' outputs (12.75 MiB) fit the step's freed blocks, and their float32 LSE
    (272 x 128 x 4 B) opens the only small-pool segment of this empty pool, 2 MiB."""
    shape = model_shape(DSV3)
    replay = replay_context_step(shape, 2048, [32768, 1776], v_padded=True, query_tokens=272)
    assert replay.context_segments == (2 * GiB, 3 * GiB // 2, 3 * GiB // 2, 2 * MiB)


def test_a_full_second_chunk_takes_one_more_kv_nope() -> None:
    """Two whole 32,768-row chunks: chunk 2's kv_nope (2 GiB) finds only chunk 1's freed padded
    v (1.5 GiB) under FA2, and nothing at all under FA3 (chunk 1's kv_nope and k are still held):
    one more 2 GiB segment either way; chunk 2's k and v then fit chunk 1's freed blocks."""
    shape = model_shape(DSV3)
    assert second_chunk_bytes(shape, 32768, 2048, v_padded=True) == 2 * GiB
    assert second_chunk_bytes(shape, 32768, 2048, v_padded=False) == 2 * GiB
    # at V2-Lite's 16 heads as well: one more 256 MiB kv_nope
    assert second_chunk_bytes(model_shape(DSV2), 32768, 2048, v_padded=True) == 256 * MiB


def test_fa3_short_second_chunk_takes_a_segment_the_step_left_too_small_for() -> None:
    """FA3 frees nothing of chunk 1 before chunk 2's kv_nope: the 111 MiB of the 1,776-row tail
    need a free block of the step's (2,048 tokens: kv_nope 128 MiB, k 96 MiB): the 128 MiB one."""
    shape = model_shape(DSV3)
    replay = replay_context_step(shape, 2048, [32768, 1776], v_padded=False)
    assert replay.context_segments == (2 * GiB, 3 * GiB // 2)
    small_step = replay_context_step(shape, 256, [32768, 1776], v_padded=False)
    # a 256-token step's kv_nope is 16 MiB: the tail needs its own 112 MiB segment (111 MiB
    # rounded to the allocator's 2 MiB)
    assert small_step.context_segments == (2 * GiB, 3 * GiB // 2, 112 * MiB)


def test_small_tensors_share_one_20_mib_segment() -> None:
    """A 256-token step at 16 heads: kv_nope 2 MiB, k and padded v 1.5 MiB each: the first
    takes a 20 MiB segment (requests of 1-10 MiB), the others split its remainder."""
    replay = replay_context_step(model_shape(DSV2), 256, [], v_padded=True)
    assert replay.step_bytes == 20 * MiB


def test_a_second_head_count_and_kv_lora_rank() -> None:
    """64 heads, kv_lora_rank 256 (the chunk's tensors do not depend on the latent's width):
    32,768 x 64 x 256 x 2 B = 1 GiB kv_nope, 768 MiB k and padded v; 2,048-token step 64 + 2 x
    48 MiB. The workspace's rule depends only on the grid."""
    shape = model_shape(MLA64)
    total = mla_context_bytes(shape, 32768, 2048, v_padded=True, standin_in_headroom=False)
    assert total == GiB + 2 * 768 * MiB + (64 + 2 * 48) * MiB


def test_workspace_is_aligned_to_the_block() -> None:
    """align_mla_chunked_context_workspace_size: round_up(max(rule, block), block)."""
    assert chunked_prefill_workspace_tokens(1001, 2, 64) == 8064  # 8,008 rounded up
    assert chunked_prefill_workspace_tokens(4096, 64, 64) == 32768


def test_the_derived_sequence_reserves_what_the_recorded_context_step_did() -> None:
    """Call 19's context step (torch allocator history, raw/call19-logs): the segments the
    context chunks' requests opened (stack through ``_compute_prefill_context``), against the
    derived sequence replayed for that step: 17 x 16 new tokens over 34,544 cached rows, chunks
    of 32,768 and 1,776 rows, FA2. The recorded history is the measurement; the replay is the
    derivation (its small LSE segment aside, which the recorded pool's small blocks served)."""
    from memest.snapshot import load_snapshot

    snap = load_snapshot(
        RAW / "call19-logs/L_dsv2lite8l_s64_t2048_fa.apply-hist-stephist.context_step.pickle.gz"
    )
    ev, frames, stacks = snap["events"], snap["frames"], snap["stacks"]
    recorded = [
        ev["size"][i]
        for i in range(len(ev["action"]))
        if snap["actions"][ev["action"][i]] == "segment_alloc"
        and ev["stack"][i] >= 0
        and any(frames[f][2] == "_compute_prefill_context" for f in stacks[ev["stack"][i]])
    ]
    replay = replay_context_step(
        model_shape(DSV2), 2048, [32768, 1776], v_padded=True, query_tokens=272
    )
    large = [s for s in replay.context_segments if s > 2 * MiB]
    assert recorded == large == [256 * MiB, 192 * MiB, 192 * MiB]


def _context_segments(history: str) -> list[int]:
    """Segments a recorded context step opened from MLA's ``_compute_prefill_context``."""
    from memest.snapshot import load_snapshot

    snap = load_snapshot(RAW / history)
    ev, frames, stacks = snap["events"], snap["frames"], snap["stacks"]
    return [
        ev["size"][i]
        for i in range(len(ev["action"]))
        if snap["actions"][ev["action"][i]] == "segment_alloc"
        and ev["stack"][i] >= 0
        and any(frames[f][2] == "_compute_prefill_context" for f in stacks[ev["stack"][i]])
    ]


def test_the_derived_sequence_reserves_what_deepseek_v3s_context_step_did() -> None:
    """Call 31's context step of DeepSeek-V3's attention (128 heads, kv_lora_rank 512): the
    same 17 requests over 34,544 cached rows. By hand, the first 32,768-row chunk: kv_b_proj's
    output [32,768 x 128 heads x (128 nope + 128 v)] x 2 B = 2 GiB; k [32,768 x 128 x 192] x 2 B
    = 1.5 GiB; FA2's v padded to 192, 1.5 GiB. The second chunk (1,776 rows) fits their blocks."""
    recorded = _context_segments(
        "call31-logs/V3_dsv3mla5l_s64_t2048_fa.apply-hist-stephist.context_step.pickle.gz"
    )
    replay = replay_context_step(
        model_shape(DSV3), 2048, [32768, 1776], v_padded=True, query_tokens=272
    )
    large = [s for s in replay.context_segments if s > 2 * MiB]
    assert recorded == large == [2 * GiB, 1536 * MiB, 1536 * MiB]


def _step_and_context_segments(history: str) -> tuple[list[int], list[int]]:
    """A recorded context step's segments: those the serving steps before it opened (the first
    full-size step's) and those MLA's ``_compute_prefill_context`` opened."""
    from memest.snapshot import load_snapshot

    snap = load_snapshot(RAW / history)
    ev, frames, stacks = snap["events"], snap["frames"], snap["stacks"]
    step: list[int] = []
    context: list[int] = []
    for i in range(len(ev["action"])):
        if snap["actions"][ev["action"][i]] != "segment_alloc" or ev["stack"][i] < 0:
            continue
        names = {frames[f][2] for f in stacks[ev["stack"][i]]}
        (context if "_compute_prefill_context" in names else step).append(ev["size"][i])
    return step, context


def test_the_derived_sequence_reserves_what_the_64_head_shapes_context_step_did() -> None:
    """Call 37's K shape (64 heads, kv_lora_rank 256, dense MLP), memest apply, FA2: 17 requests
    over 34,544 cached rows, chunks of 32,768 and 1,776 rows. By hand, the first chunk:
    kv_b_proj's output [32,768 x 64 x (128 nope + 128 v)] x 2 B = 1 GiB; k [32,768 x 64 x 192]
    x 2 B = 768 MiB; FA2's v padded to 192, 768 MiB; the second chunk fits their blocks. The
    recorded step opened exactly those three, segment by segment, plus two 2 MiB small segments
    (the lab's stand-ins for gather_and_maybe_dequant_cache and merge_attn_states). What the
    context step reserved beyond the end of init is the first full-size step's segments and
    these: 440 MiB + 2,560 MiB + 2 x 2 MiB = 3,149,922,304 B, as the harness measured it."""
    step, context = _step_and_context_segments(
        "call37-logs/K_mla64h8l_s64_t2048_fa.apply-hist-stephist.context_step.pickle.gz"
    )
    replay = replay_context_step(
        model_shape(MLA64), 2048, [32768, 1776], v_padded=True, query_tokens=272
    )
    large = [s for s in replay.context_segments if s > 2 * MiB]
    assert [s for s in context if s > 2 * MiB] == large == [GiB, 768 * MiB, 768 * MiB]
    assert [s for s in context if s <= 2 * MiB] == [2 * MiB, 2 * MiB]
    rec = harness_record("call37", "K_mla64h8l_s64_t2048_fa", "apply-hist-stephist")
    assert sum(step) == rec["step_reserved_growth_bytes"] == 440 * MiB
    assert sum(step) + sum(context) == rec["context_step_reserved_growth_bytes"]
    assert rec["context_step_reserved_growth_bytes"] == 3_149_922_304


def test_the_derived_sequence_reserves_what_deepseek_v3s_moe_start_context_step_did() -> None:
    """Call 36: DeepSeek-V3's attention with its MoE layers (3 dense, 2 MoE): the chunks'
    segments are call 31's, 2 GiB + 2 x 1.5 GiB, and no small one (the pool's small blocks
    served the stand-ins); the context step reserved the first step's 926 MiB and those."""
    step, context = _step_and_context_segments(
        "call36-logs/V3_dsv3mla5l_s64_t2048_fa.apply-hist-stephist.context_step.pickle.gz"
    )
    replay = replay_context_step(
        model_shape(DSV3), 2048, [32768, 1776], v_padded=True, query_tokens=272
    )
    large = [s for s in replay.context_segments if s > 2 * MiB]
    assert context == large == [2 * GiB, 1536 * MiB, 1536 * MiB]
    rec = harness_record("call36", "V3_dsv3mla5l_s64_t2048_fa", "apply-hist-stephist")
    assert sum(step) == rec["step_reserved_growth_bytes"] == 926 * MiB
    assert sum(step) + sum(context) == rec["context_step_reserved_growth_bytes"]

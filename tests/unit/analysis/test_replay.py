"""The replay: stage growth, triggers, live peaks, retained, phase split — on hand-built traces.

Every expected figure below is written out from the trace's construction, not computed by memest.
"""

from __future__ import annotations

from typing import Any

import pytest

from memest.analysis import OwnerRules, analyze
from memest.errors import SnapshotFormatError
from memest.schema.breakdown import MemoryReading, PhaseRecord
from memest.snapshot import empty_snapshot, from_torch
from memest.snapshot.tags import StageTag, format_tag

MiB = 1 << 20


def fr(*names: str) -> list[dict[str, Any]]:
    return [{"filename": f"vllm/{n}.py", "line": 1, "name": n} for n in names]


def tag(**kw: Any) -> str:
    return format_tag(StageTag(**kw))


def ev(
    action: str,
    addr: int,
    size: int,
    frames: list[dict[str, Any]] | None = None,
    meta: str = "",
    stream: int = 0,
    t: int = 0,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "time_us": t,
        "frames": frames or [],
    }
    if meta:
        e["user_metadata"] = meta
    return e


def snap(
    events: list[dict[str, Any]],
    segments: list[tuple[int, int, tuple[int, int]]] = (),
    **extra: Any,
) -> dict[str, Any]:
    raw = {
        "segments": [
            {"address": a, "total_size": s, "segment_pool_id": p, "blocks": []}
            for a, s, p in segments
        ],
        "device_traces": [events],
    }
    out = from_torch(raw)
    out.update(extra)
    return out


PW = tag(phase="capture", stage="target.piecewise", capture_size=4, pool="0,1")
PW2 = tag(phase="capture", stage="target.piecewise", capture_size=2, pool="0,1")
FULL = tag(phase="capture", stage="target.full", capture_size=8, pool="0,1")
WARM = tag(phase="capture", stage="target.full", capture_size=8)  # eager warm-up, no pool


def scenario() -> dict[str, Any]:
    aux, idx, mys = fr("_maybe_add_hidden_state"), fr("fp8_fp4_paged_mqa_logits"), fr("mystery")
    return snap(
        [
            ev("segment_alloc", 0x1000_0000, 20 * MiB, aux, PW),
            ev("alloc", 0x1000_0000, 4 * MiB, aux, PW),
            ev("alloc", 0x1040_0000, 2 * MiB, aux, PW2),
            # warm-up grows the default pool under the FULL stage tag
            ev("segment_alloc", 0x9000_0000, 4 * MiB, fr("eager"), WARM),
            ev("alloc", 0x9000_0000, 3 * MiB, fr("eager"), WARM),
            ev("free_requested", 0x9000_0000, 3 * MiB, [], WARM),
            ev("free_completed", 0x9000_0000, 3 * MiB, [], WARM),
            ev("segment_free", 0x9000_0000, 4 * MiB, [], WARM),
            # the same address is reused by a private-pool segment in the capture window
            ev("segment_alloc", 0x9000_0000, 64 * MiB, idx, FULL),
            ev("alloc", 0x9000_0000, 64 * MiB, idx, FULL),
            ev("segment_alloc", 0x2000_0000, 2 * MiB, mys, FULL),
            ev("alloc", 0x2000_0000, 512, mys, FULL),
            ev("free_requested", 0x9000_0000, 64 * MiB, [], FULL),
            ev("free_completed", 0x9000_0000, 64 * MiB, [], FULL),
        ],
        [
            (0x1000_0000, 20 * MiB, (0, 1)),
            (0x9000_0000, 64 * MiB, (0, 1)),
            (0x2000_0000, 2 * MiB, (0, 1)),
        ],
    )


def test_stage_growth_and_default_pool_growth() -> None:
    bd = analyze(scenario())
    stages = {s.stage: s for s in bd.stages}
    assert stages["target.piecewise"].pool_growth_bytes == 20 * MiB
    assert stages["target.full"].pool_growth_bytes == 66 * MiB
    assert stages["target.full"].default_pool_growth_bytes == 4 * MiB
    assert stages["target.full"].pools == ["0,1"]
    assert stages["target.piecewise"].capture_sizes == [2, 4]
    assert bd.graph_pool_growth_bytes == 86 * MiB


def test_trigger_rows_charge_whole_segments() -> None:
    bd = analyze(scenario())
    rows = {(t.stage, t.owner): t for t in bd.triggers}
    assert rows[("target.piecewise", "aux_hidden_states")].bytes == 20 * MiB
    assert rows[("target.piecewise", "aux_hidden_states")].requested_bytes == 4 * MiB
    assert rows[("target.full", "indexer_logits_bf16")].bytes == 64 * MiB
    assert rows[("target.full", "unattributed:mystery (vllm/mystery.py)")].bytes == 2 * MiB
    assert sum(t.bytes for t in bd.triggers) == 86 * MiB


def test_live_peaks_and_retained() -> None:
    bd = analyze(scenario())
    peaks = {(p.stage, p.owner): p.peak_bytes for p in bd.live_peaks}
    assert peaks[("target.piecewise", "aux_hidden_states")] == 6 * MiB
    assert peaks[("target.full", "indexer_logits_bf16")] == 64 * MiB
    retained = {(r.owner, r.capture_size): r.bytes for r in bd.retained}
    assert retained[("aux_hidden_states", 4)] == 4 * MiB
    assert retained[("aux_hidden_states", 2)] == 2 * MiB
    assert ("indexer_logits_bf16", 8) not in retained  # freed inside the capture


def test_unattributed_listed_by_top_frame() -> None:
    bd = analyze(scenario())
    trig = [u for u in bd.unattributed if u.view == "trigger"]
    assert [(u.stage, u.top_frame, u.bytes) for u in trig] == [
        ("target.full", "mystery (vllm/mystery.py:1)", 2 * MiB)
    ]
    ret = [u for u in bd.unattributed if u.view == "retained"]
    assert [(u.top_frame, u.bytes) for u in ret] == [("mystery (vllm/mystery.py)", 512)]


def test_pool_rows_match_final_segments() -> None:
    bd = analyze(scenario())
    pools = {p.pool: p for p in bd.pools}
    assert pools["0,1"].growth_bytes == 86 * MiB
    assert pools["0,1"].reserved_end_bytes == 86 * MiB
    assert pools["0,0"].growth_bytes == 4 * MiB and pools["0,0"].released_bytes == 4 * MiB


def test_pool_learnt_at_window_end_and_graph_count() -> None:
    in_win = tag(phase="capture", stage="draft.steps.full", capture_size=1, window=3)
    windows = [
        {"kind": "capture", "tag": in_win, "window": 3, "pool": "0,7", "start_us": 0, "end_us": 9},
        {
            "kind": "capture",
            "tag": in_win,
            "window": 4,
            "pool": "0,7",
            "start_us": 10,
            "end_us": 19,
        },
    ]
    s = snap([ev("segment_alloc", 0x10, 2 * MiB, fr("x"), in_win)], windows=windows)
    bd = analyze(s)
    assert bd.stages[0].pools == ["0,7"]
    assert bd.stages[0].graph_count == 2
    assert bd.stages[0].pool_growth_bytes == 2 * MiB


def test_segment_free_charged_to_the_pool_that_owned_the_address() -> None:
    a = tag(phase="capture", stage="a", pool="0,1")
    b = tag(phase="capture", stage="b", pool="0,2")
    s = snap(
        [
            ev("segment_alloc", 0x10, 2 * MiB, fr("x"), a),
            ev("segment_free", 0x10, 2 * MiB, [], b),  # tag says pool 0,2, but the segment was 0,1
            ev("segment_alloc", 0x10, 4 * MiB, fr("x"), b),
        ]
    )
    bd = analyze(s)
    pools = {p.pool: p for p in bd.pools}
    assert pools["0,1"].released_bytes == 2 * MiB
    assert pools["0,2"].released_bytes == 0
    assert pools["0,2"].growth_bytes == 4 * MiB


def test_time_windows_when_events_carry_no_tag() -> None:
    full = tag(phase="capture", stage="target.full", window=1)
    windows = [
        {
            "kind": "stage",
            "tag": tag(phase="capture", stage="target.full"),
            "start_us": 100,
            "end_us": 200,
        },
        {
            "kind": "capture",
            "tag": full,
            "window": 1,
            "pool": "0,1",
            "start_us": 150,
            "end_us": 180,
        },
    ]
    s = snap(
        [
            ev("segment_alloc", 0x10, 2 * MiB, fr("eager"), t=120),
            ev("segment_alloc", 0x20, 8 * MiB, fr("as_fp32_logits"), t=160),
            ev("segment_alloc", 0x30, 2 * MiB, fr("late"), t=300),
        ],
        windows=windows,
    )
    bd = analyze(s)
    st = {x.stage: x for x in bd.stages}
    assert st["target.full"].pool_growth_bytes == 8 * MiB
    assert st["target.full"].default_pool_growth_bytes == 2 * MiB
    assert [(t.owner, t.bytes) for t in bd.triggers] == [("indexer_logits_fp32", 8 * MiB)]


def test_pool_id_on_events_wins() -> None:
    s = snap([ev("segment_alloc", 0x10, 2 * MiB, fr("x"), tag(stage="s"))])
    s["events"]["pool"] = [0]
    s["pools"] = ["0,9"]
    bd = analyze(s)
    assert bd.stages[0].pools == ["0,9"]


def test_expandable_segment_map_counts_as_growth() -> None:
    t = tag(phase="capture", stage="s", pool="0,1")
    s = snap(
        [
            ev("segment_map", 0x10, 2 * MiB, fr("x"), t),
            ev("segment_map", 0x10 + 2 * MiB, 2 * MiB, fr("y"), t),
            ev("segment_unmap", 0x10 + 2 * MiB, 2 * MiB, [], t),
        ]
    )
    bd = analyze(s)
    assert bd.stages[0].pool_growth_bytes == 4 * MiB
    assert bd.stages[0].pool_released_bytes == 2 * MiB


def reading(used: int | None, reserved: int, pools: dict[str, int]) -> MemoryReading:
    return MemoryReading(
        time_ns=0,
        device_used_bytes=used,
        torch_reserved_bytes=reserved,
        pool_reserved_bytes=pools,
        device_source="nvml" if used else "none",
    )


def test_phase_split() -> None:
    phase = PhaseRecord(
        name="capture",
        start=reading(10 * MiB, 4 * MiB, {"0,0": 4 * MiB}),
        end=reading(110 * MiB, 94 * MiB, {"0,0": 8 * MiB, "0,1": 86 * MiB}),
    )
    bd = analyze(scenario(), [phase])
    (row,) = bd.phases
    assert row.total_added_bytes == 100 * MiB
    assert row.graph_pool_bytes == 86 * MiB
    assert row.other_torch_bytes == 4 * MiB
    assert row.outside_torch_bytes == 10 * MiB


def test_phase_split_without_device_reading_warns() -> None:
    phase = PhaseRecord(name="capture", start=reading(None, 0, {}), end=reading(None, 2 * MiB, {}))
    bd = analyze(snap([]), [phase])
    assert bd.phases[0].total_added_bytes == 2 * MiB
    assert any("no device reading" in w for w in bd.warnings)


def test_ring_buffer_full_warns() -> None:
    s = snap([ev("alloc", 0x10, 512, fr("x"), tag(stage="s"))])
    s["source"]["max_entries"] = 1
    assert any("max_entries" in w for w in analyze(s).warnings)


def test_untagged_history_warns() -> None:
    assert any(
        "no event carries a stage tag" in w
        for w in analyze(snap([ev("alloc", 1, 512, fr("x"))])).warnings
    )


def test_user_rules_change_owner() -> None:
    rules = OwnerRules.default().extend(
        OwnerRules.from_data({"rules": [{"owner": "mine", "function": "mystery"}]})
    )
    bd = analyze(scenario(), rules=rules)
    assert ("target.full", "mine") in {(t.stage, t.owner) for t in bd.triggers}
    assert not [u for u in bd.unattributed if u.view == "trigger"]


def test_malformed_snapshot_rejected() -> None:
    bad = empty_snapshot()
    del bad["events"]
    with pytest.raises(SnapshotFormatError, match="missing key 'events'"):
        analyze(bad)


def _indexer_history(with_copy: bool, kernel_element_bytes: int) -> dict[str, Any]:
    """One FULL capture of 8 rows x 4,096 positions: the paged MQA-logits kernel's output, and
    (SM100 form) vLLM's FP32 copy of it; 8 x 4,096 x 2 B = 64 KiB BF16, x 4 B = 128 KiB FP32."""
    kernel, copy = fr("fp8_fp4_paged_mqa_logits"), fr("as_fp32_logits")
    kernel_bytes = 8 * 4096 * kernel_element_bytes
    events = [
        ev("segment_alloc", 0x3000_0000, 2 * MiB, kernel, FULL),
        ev("alloc", 0x3000_0000, kernel_bytes, kernel, FULL),
    ]
    if with_copy:
        events.append(ev("alloc", 0x3010_0000, 8 * 4096 * 4, copy, FULL))
    return snap(events, [(0x3000_0000, 2 * MiB, (0, 1))])


def _owner_bytes(history: dict[str, Any], capability: str | None) -> dict[str, int]:
    bd = analyze(history, compute_capability=capability)
    return {p.owner: p.peak_bytes for p in bd.live_peaks if p.stage == "target.full"}


def test_indexer_kernel_output_without_a_copy_on_sm90_is_fp32() -> None:
    # DeepGEMM's SM90 kernel writes FP32; vLLM's as_fp32_logits returns it unchanged (no copy)
    assert _owner_bytes(_indexer_history(with_copy=False, kernel_element_bytes=4), "9.0") == {
        "indexer_logits_fp32_kernel": 128 * 1024
    }
    bd = analyze(_indexer_history(False, kernel_element_bytes=4), compute_capability="9.0")
    assert [t.owner for t in bd.triggers] == ["indexer_logits_fp32_kernel"]


def test_indexer_kernel_output_with_vllms_copy_is_bf16() -> None:
    # SM100's pair (or the lab's BF16 stand-in on an H200): BF16 output, then the FP32 copy
    for capability in ("9.0", "10.0", None):
        assert _owner_bytes(_indexer_history(True, kernel_element_bytes=2), capability) == {
            "indexer_logits_bf16": 64 * 1024,
            "indexer_logits_fp32": 128 * 1024,
        }


def test_indexer_kernel_output_without_a_copy_off_sm90_keeps_bf16() -> None:
    # SM100 with DeepSelect's top-k reads BF16 without a copy; an unknown GPU keeps the rule's name
    for capability in ("10.0", None):
        assert _owner_bytes(_indexer_history(False, kernel_element_bytes=2), capability) == {
            "indexer_logits_bf16": 64 * 1024
        }

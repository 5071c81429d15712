"""Analysis of real allocator snapshots recorded on an H200 (torch 2.11) by lab/validate_pools.py.

The workloads are known by construction (see that script); the figures below are written from
the construction: shapes x dtype sizes, and the caching allocator's rounding (large requests get
segments rounded up to 2 MiB; a request below 1 MiB gets a 2 MiB small segment).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memest.analysis import OwnerRules, analyze
from memest.cli import main
from memest.schema.breakdown import Breakdown
from memest.snapshot import load_snapshot

DATA = Path(__file__).resolve().parents[2] / "data" / "snapshots"
MiB = 1 << 20
PIECEWISE_SIZES = [512, 256, 128, 64, 32, 16, 8, 4, 2, 1]
AUX_PER_TOKEN = 3 * 4096 * 2  # three aux layers x hidden 4096 x bf16


@pytest.fixture(scope="module")
def capture() -> Breakdown:
    return analyze(load_snapshot(DATA / "validate_capture.memest.json"))


def _charged(bd: Breakdown, stage: str, owner: str) -> int:
    return sum(t.bytes for t in bd.triggers if t.stage == stage and t.owner == owner)


def test_snapshots_are_small_and_scrubbed() -> None:
    for path in DATA.iterdir():
        assert path.stat().st_size < 1 * MiB, path
        text = path.read_bytes()
        for local in (b"/home/", b"/work/", b"/opt/", b"/usr/", b"/tmp/"):
            assert local not in text, (path, local)


def test_trigger_table_charges_each_owner(capture: Breakdown) -> None:
    # 512 rows x 65536 context: BF16 = 64 MiB, FP32 copy = 128 MiB (multiples of 2 MiB).
    assert _charged(capture, "target.full", "indexer_logits_bf16") == 64 * MiB
    assert _charged(capture, "target.full", "indexer_logits_fp32") == 128 * MiB
    # 256 requests x K=4 x vocab 128000 x bf16 = 262,144,000 bytes = 125 x 2 MiB.
    assert _charged(capture, "draft.block.full", "draft_logits") == 262_144_000
    aux = _charged(capture, "target.piecewise", "aux_hidden_states")
    assert (
        AUX_PER_TOKEN * sum(PIECEWISE_SIZES)
        <= aux
        < AUX_PER_TOKEN * sum(PIECEWISE_SIZES) + 22 * MiB
    )


def test_trigger_rows_sum_to_stage_growth(capture: Breakdown) -> None:
    for stage in capture.stages:
        rows = [
            t.bytes for t in capture.triggers if (t.phase, t.stage) == (stage.phase, stage.stage)
        ]
        assert sum(rows) == stage.pool_growth_bytes


def test_retained_aux_per_capture_size(capture: Breakdown) -> None:
    by_size = {r.capture_size: r.bytes for r in capture.retained if r.owner == "aux_hidden_states"}
    assert by_size == {n: AUX_PER_TOKEN * n for n in PIECEWISE_SIZES}
    assert sum(by_size.values()) == 25_141_248


def test_graph_counts_and_widest(capture: Breakdown) -> None:
    stages = {s.stage: s for s in capture.stages if s.phase == "capture"}
    assert stages["target.piecewise"].graph_count == 10
    assert stages["target.full"].graph_count == 4
    assert stages["draft.block.full"].graph_count == 3
    assert stages["target.full"].widest == "512"
    assert stages["target.full"].capture_sizes == [64, 128, 256, 512]


def test_phase_split_matches_pool_replay(capture: Breakdown) -> None:
    split = {p.phase: p for p in capture.phases}
    growth = sum(s.pool_growth_bytes - s.pool_released_bytes for s in capture.stages)
    assert split["capture"].graph_pool_bytes == growth
    # 512 MiB + 12345 bytes of weights: one segment rounded up to 2 MiB, all of it PyTorch's.
    assert split["weights"].other_torch_bytes == 514 * MiB
    assert split["weights"].graph_pool_bytes == 0


def test_live_peaks(capture: Breakdown) -> None:
    peaks = {(p.stage, p.owner): p.peak_bytes for p in capture.live_peaks}
    assert peaks[("target.full", "indexer_logits_bf16")] == 64 * MiB
    assert peaks[("target.full", "indexer_logits_fp32")] == 128 * MiB
    assert peaks[("draft.block.full", "draft_logits")] == 262_144_000


def test_private_pool_replay_matches_final_segments(capture: Breakdown) -> None:
    for pool in capture.pools:
        if pool.private:
            assert pool.growth_bytes - pool.released_bytes == pool.reserved_end_bytes


def test_raw_torch_pickle_and_memest_json_agree() -> None:
    from_pickle = analyze(load_snapshot(DATA / "two_pools.torch.pickle"))
    from_json = analyze(load_snapshot(DATA / "two_pools.memest.json"))
    assert from_pickle.triggers == from_json.triggers
    assert from_pickle.retained == from_json.retained
    pools = {s.stage: s.pools for s in from_json.stages}
    assert len(pools["target.piecewise"]) == 1 and len(pools["draft.steps.full"]) == 1
    assert pools["target.piecewise"] != pools["draft.steps.full"]  # two separate graph pools
    # aux: 3 x hidden 256 x bf16 per token, sizes 64, 32, 16
    aux = {r.capture_size: r.bytes for r in from_json.retained if r.owner == "aux_hidden_states"}
    assert aux == {64: 3 * 256 * 2 * 64, 32: 3 * 256 * 2 * 32, 16: 3 * 256 * 2 * 16}


def test_expandable_segments_grow_by_segment_map() -> None:
    snap = load_snapshot(DATA / "expandable.memest.json")
    assert "segment_map" in snap["actions"]
    bd = analyze(snap)
    (stage,) = [s for s in bd.stages if s.stage == "target.full"]
    assert stage.pool_growth_bytes > 0 and stage.pool_growth_bytes % (2 * MiB) == 0
    assert sum(t.bytes for t in bd.triggers) == stage.pool_growth_bytes
    # a 24 MiB eager tensor under the stage tag lands in the default pool, not the graph pool
    assert stage.default_pool_growth_bytes >= 24 * MiB
    retained = {
        r.capture_size: r.bytes
        for r in bd.retained
        if r.owner.endswith("(validate_pools.py)") and r.owner.startswith("unattributed:<lambda>")
    }
    assert retained == {32: 32 * 256 * 2, 16: 16 * 256 * 2}


def test_default_rules_need_no_user_file(capture: Breakdown) -> None:
    owners = {t.owner for t in capture.triggers}
    assert {
        "indexer_logits_bf16",
        "indexer_logits_fp32",
        "draft_logits",
        "aux_hidden_states",
    } <= owners
    assert OwnerRules.default().rules  # defaults are data, non-empty


def test_cli_on_real_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(DATA / "validate_capture.memest.json"), "--md"]) == 0
    out = capsys.readouterr().out
    assert "| indexer_logits_fp32 | 0.125 |" in out
    assert "| Total graph pool |  | 17 (pieces counted) | 0.457 |" in out

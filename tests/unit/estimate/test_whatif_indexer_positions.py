"""The what-if moves the DSA indexer's logits with max_model_len as well as with the FULL rows.

vLLM 0.33.0's decode path returns [B x next_n, max_model_len] logits (vllm/utils/deep_gemm.py
``fp8_fp4_paged_mqa_logits``), so their bytes are rows x max_model_len x element bytes: from G to
G' they scale by (widest FULL rows at G' / at G) x (max_model_len at G' / at G). The hand-built
start (conftest.py) has target.full graphs of 1 and 2 requests x q 4 (widest 8 rows) at G and of
1, 2 and 4 requests (16 rows) at G'; its indexer rows are 400 MiB FP32 and 200 MiB BF16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memest.estimate.poolreplay import Graph, PoolRequest, PoolTrace
from memest.estimate.whatif.grid import Grids
from memest.estimate.whatif.pools import measured_pools, positions_ratio, with_positions
from memest.schema import CapturePlan, RunReport
from memest.units import MiB

from .conftest import PLAN_G, PLAN_G2  # noqa: TID252

Factory = Callable[[], dict[str, Any]]


def _pair(report: RunReport, before: int | None, after: int | None) -> Grids:
    return Grids(
        (CapturePlan.model_validate(PLAN_G), CapturePlan.model_validate(PLAN_G2)),
        (
            report.config.model_copy(update={"max_model_len": before}),
            report.config.model_copy(update={"max_model_len": after}),
        ),
    )


def _rows(report: RunReport, pair: Grids) -> dict[tuple[str, str], int]:
    rows, _ = measured_pools(report, pair, None, "")
    return {(p.stage, p.owner): p.predicted_bytes for p in rows}


def test_rows_and_max_model_len_both_scale_the_indexer(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    got = _rows(report, _pair(report, 4096, 16384))
    # 16 / 8 rows x 16,384 / 4,096 positions = x8
    assert got[("target.full", "indexer_logits_fp32")] == 400 * MiB * 8
    assert got[("target.full", "indexer_logits_bf16")] == 200 * MiB * 8
    # other owners of the stage do not score positions: widest tokens only (x2)
    assert got[("target.full", "attn_output")] == 10 * MiB * 2


def test_unchanged_or_unknown_max_model_len_leaves_the_rows_law(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    for before, after in ((4096, 4096), (None, 16384), (4096, None)):
        got = _rows(report, _pair(report, before, after))
        assert got[("target.full", "indexer_logits_fp32")] == 400 * MiB * 2


def test_a_shorter_max_model_len_shrinks_them(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    pair = _pair(report, 8192, 2048)
    assert positions_ratio(pair.configs) == 0.25
    # x2 rows x 1/4 positions
    assert _rows(report, pair)[("target.full", "indexer_logits_fp32")] == 200 * MiB


def test_the_overlay_grid_carries_max_model_len(make_report: Factory) -> None:
    data = make_report()
    data["config"].update(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4096)
    report = RunReport.model_validate(data)
    from memest.estimate.whatif.grid import grids

    pair = grids(report, {"max_model_len": 16384})
    assert [c.max_model_len for c in pair.configs] == [4096, 16384]
    assert positions_ratio(pair.configs) == 4.0


def test_the_replay_resizes_only_the_indexer_requests() -> None:
    graph = Graph(
        "target.full",
        8,
        [
            PoolRequest(1, 1 << 20, 0, "indexer_logits_fp32_kernel", 0),
            PoolRequest(2, 3 << 20, 0, "attn_output", 1),
            1,
            2,
        ],
    )
    trace = PoolTrace("t", {"target.full": [graph]}, {}, {})
    resized = with_positions(trace, 4.0).stages["target.full"][0]
    assert [(a.owner, a.size) for a in resized.allocs] == [
        ("indexer_logits_fp32_kernel", 4 << 20),
        ("attn_output", 3 << 20),
    ]
    assert resized.ops[2:] == [1, 2]
    assert with_positions(trace, 1.0) is trace


def test_the_synthetic_trace_of_a_dsa_target_follows_max_model_len() -> None:
    """Without a snapshot a what-if writes a DSA target's stages with the synthetic trace: its
    FULL graphs' indexer logits at the grid's max_model_len. lab/models/dsv32_4l at 64 sequences:
    the widest FULL graph's FP32 logits are 64 x 163,840 x 4 = 40 MiB, a segment of their own
    (test_dsa.py); at 4,096 positions (1 MiB) they fit the blocks the PIECEWISE graphs left."""
    import json
    from pathlib import Path

    from memest.estimate.runner_buffers import ModelDims
    from memest.estimate.whatif_synthetic import _synthetic, shapes
    from memest.plan.overlay import overlay_plan
    from memest.schema import RunConfig

    root = Path(__file__).resolve().parents[3]
    cfg = json.loads((root / "lab/models/dsv32_4l/config.json").read_text())
    dims = ModelDims(hidden_size=7168, vocab_size=129280, config=cfg)
    base = RunConfig(
        model="dsv32", max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096
    )
    for sm100, owner in ((False, "indexer_logits_fp32_kernel"), (True, "indexer_logits_fp32")):
        s = shapes(dims, 1, sm100=sm100)
        for mml, want in ((4096, 0), (163840, 40 * MiB)):
            plan, config = overlay_plan(base, {"max_model_len": mml}, "h200")
            got = _synthetic(plan, config, s)
            assert got.get(("target.full", owner), 0) == want

"""Stage bars: pool growth per capture stage split by owner, grouped once, capped on request."""

from __future__ import annotations

from memest.analysis.stages import OTHER_OWNER, OTHER_STAGE, REMAINDER_OWNER, stage_bars
from memest.demo import demo_report
from memest.schema import RunReport
from memest.schema.breakdown import RetainedRow, StageGrowth, TriggerRow
from memest.units import GiB, MiB


def _report(
    stages: list[StageGrowth], triggers: list[TriggerRow], retained: list[RetainedRow]
) -> RunReport:
    rep = demo_report("minimax-m3-eagle3-k3", "PR")
    assert rep.breakdown is not None
    bd = rep.breakdown.model_copy(
        update={"stages": stages, "triggers": triggers, "retained": retained}
    )
    return rep.model_copy(update={"breakdown": bd})


def test_rows_are_summed_per_owner_of_their_own_stage() -> None:
    rep = _report(
        stages=[
            StageGrowth(stage="a", pool_growth_bytes=4 * GiB),
            StageGrowth(stage="b", pool_growth_bytes=1 * GiB),
            StageGrowth(stage="c", pool_growth_bytes=3 * MiB),
        ],
        triggers=[
            TriggerRow(stage="a", owner="x", bytes=1 * GiB, note="first"),
            TriggerRow(stage="b", owner="x", bytes=512 * MiB),
            TriggerRow(stage="a", owner="y", bytes=2 * GiB),
            TriggerRow(stage="a", owner="x", bytes=512 * MiB, note="second"),
            # Same stage name in the profiling phase: not part of the capture's bars.
            TriggerRow(stage="a", owner="z", bytes=GiB, phase="graph_profiling"),
        ],
        retained=[
            RetainedRow(stage="c", owner="w", bytes=1 * MiB),
            RetainedRow(stage="b", owner="v", bytes=1 * MiB),  # b has trigger rows: ignored
        ],
    )
    bars = {b.stage: [(o.owner, o.bytes, o.note) for o in b.owners] for b in stage_bars(rep)}
    # a: y 2 GiB, x 1.5 GiB (the first row's note), 0.5 GiB unclaimed.
    # b: x 0.5 GiB, 0.5 GiB unclaimed. c: w 1 MiB retained, 2 MiB unclaimed (over GiB/1000).
    assert bars == {
        "a": [("y", 2 * GiB, ""), ("x", 1536 * MiB, "first"), (REMAINDER_OWNER, 512 * MiB, "")],
        "b": [("x", 512 * MiB, ""), (REMAINDER_OWNER, 512 * MiB, "")],
        "c": [(REMAINDER_OWNER, 2 * MiB, ""), ("w", 1 * MiB, "retained at end of init")],
    }


def test_a_capped_stage_sums_its_smaller_owners_into_other() -> None:
    rep = _report(
        stages=[StageGrowth(stage="a", pool_growth_bytes=10 * MiB)],
        triggers=[
            TriggerRow(stage="a", owner=f"o{i}", bytes=(i + 1) * MiB) for i in range(4)
        ],  # o0..o3: 1, 2, 3, 4 MiB; 10 MiB claimed, nothing unclaimed
        retained=[],
    )
    (uncapped,) = stage_bars(rep)
    assert [o.owner for o in uncapped.owners] == ["o3", "o2", "o1", "o0"]
    (capped,) = stage_bars(rep, max_owners=3)
    assert [(o.owner, o.bytes) for o in capped.owners] == [
        ("o3", 4 * MiB),
        ("o2", 3 * MiB),
        (OTHER_OWNER, 3 * MiB),
    ]
    assert capped.owners[-1].note == "2 more owners"
    (same,) = stage_bars(rep, max_owners=4)
    assert same.owners == uncapped.owners


def test_many_stages_and_triggers_are_grouped_once() -> None:
    n = 4000
    rep = _report(
        stages=[StageGrowth(stage=f"s{i}", pool_growth_bytes=2 * MiB) for i in range(n)],
        triggers=[TriggerRow(stage=f"s{i}", owner="x", bytes=2 * MiB) for i in range(n)],
        retained=[],
    )
    bars = stage_bars(rep)
    assert len(bars) == n
    assert all([(o.owner, o.bytes) for o in b.owners] == [("x", 2 * MiB)] for b in bars)


def test_capped_stages_keep_the_largest_in_order_and_sum_the_rest_into_other() -> None:
    # Stages s0..s4 of 5, 1, 4, 2, 3 MiB, each claimed whole by owners x and y.
    sizes = [5, 1, 4, 2, 3]
    rep = _report(
        stages=[
            StageGrowth(stage=f"s{i}", pool_growth_bytes=size * MiB, graph_count=i + 1)
            for i, size in enumerate(sizes)
        ],
        triggers=[
            TriggerRow(stage="s0", owner="x", bytes=5 * MiB),
            TriggerRow(stage="s1", owner="y", bytes=1 * MiB),
            TriggerRow(stage="s2", owner="x", bytes=4 * MiB),
            TriggerRow(stage="s3", owner="x", bytes=1 * MiB),
            TriggerRow(stage="s3", owner="y", bytes=1 * MiB),
            TriggerRow(stage="s4", owner="x", bytes=2 * MiB),
            TriggerRow(stage="s4", owner="y", bytes=1 * MiB),
        ],
        retained=[],
    )
    bars = stage_bars(rep, max_stages=3)
    # Kept: s0 (5 MiB) and s2 (4 MiB), in the report's order; other: s1 + s3 + s4 = 6 MiB, of
    # which x 1 + 2 = 3 MiB and y 1 + 1 + 1 = 3 MiB; graphs 2 + 4 + 5 = 11.
    assert [(b.stage, b.pool_growth_bytes) for b in bars] == [
        ("s0", 5 * MiB),
        ("s2", 4 * MiB),
        (OTHER_STAGE, 6 * MiB),
    ]
    other = bars[-1]
    assert sorted((o.owner, o.bytes) for o in other.owners) == [("x", 3 * MiB), ("y", 3 * MiB)]
    assert other.graph_count == 11
    assert other.widest == "3 more stages"
    # Owners of the folded stages are capped like any stage's: x and y become one "other".
    (*_, capped) = stage_bars(rep, max_stages=3, max_owners=1)
    assert [(o.owner, o.bytes) for o in capped.owners] == [(OTHER_OWNER, 6 * MiB)]
    assert stage_bars(rep, max_stages=5) == stage_bars(rep)

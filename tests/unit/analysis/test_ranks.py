from __future__ import annotations

import pytest

from memest.analysis.ranks import aggregate_ranks, rank_check
from memest.errors import ReportFormatError
from memest.estimate.parallel import run_parallel_bytes
from memest.schema import (
    Breakdown,
    KVCacheSpec,
    RunConfig,
    RunReport,
    StageGrowth,
    VllmFigures,
)

GiB = 1 << 30


def _rep(rank: int, weights: int, blocks: int, run: str = "run-1", world: int = 4) -> RunReport:
    return RunReport(
        run_id=run,
        rank=rank,
        world_size=world,
        model="m",
        config=RunConfig(model="m"),
        vllm=VllmFigures(weights_bytes=weights),
        kv_cache=KVCacheSpec(num_layers=32, block_size=16, num_blocks=blocks),
    )


def test_agreeing_ranks_are_consistent() -> None:
    agg = aggregate_ranks([_rep(r, 4 * GiB, 1000) for r in range(4)])
    assert agg.consistent and agg.ranks == [0, 1, 2, 3]
    assert agg.figures["weights_bytes"] == {r: 4 * GiB for r in range(4)}


def test_a_rank_off_by_more_than_the_threshold_is_flagged() -> None:
    reps = [
        _rep(0, 4 * GiB, 1000),
        _rep(1, 4 * GiB, 1000),
        _rep(2, 4 * GiB, 880),
        _rep(3, 4 * GiB, 1010),
    ]
    agg = aggregate_ranks(reps)
    assert [(o.figure, o.rank) for o in agg.outliers] == [("kv_blocks", 2)]
    assert "rank 2: kv_blocks 880 vs median 1000 (-12.0%)" == agg.outliers[0].describe()


def test_small_byte_differences_are_not_flagged() -> None:
    reps = [_rep(0, 100 * (1 << 20), 1), _rep(1, 140 * (1 << 20), 1)]
    # 40 % apart but under the 64 MiB absolute floor
    assert aggregate_ranks(reps, abs_threshold_bytes=64 << 20).outliers == []


def test_missing_ranks_are_named() -> None:
    agg = aggregate_ranks([_rep(0, GiB, 10), _rep(2, GiB, 10)])
    assert agg.missing_ranks == [1, 3] and not agg.consistent


def test_bad_input_is_named() -> None:
    with pytest.raises(ReportFormatError, match="no reports"):
        aggregate_ranks([])
    with pytest.raises(ReportFormatError, match="several runs given: a, b"):
        aggregate_ranks([_rep(0, GiB, 1, run="a"), _rep(1, GiB, 1, run="b")])
    with pytest.raises(ReportFormatError, match="rank 0 reported twice"):
        aggregate_ranks([_rep(0, GiB, 1), _rep(0, GiB, 1)])


def _staged(rank: int, stages: dict[str, int]) -> RunReport:
    rep = _rep(rank, 4 * GiB, 1000, world=2)
    rep.breakdown = Breakdown(
        stages=[StageGrowth(stage=name, pool_growth_bytes=b) for name, b in stages.items()]
    )
    return rep


def test_rank_check_names_the_stage_a_rank_disagrees_on() -> None:
    check = rank_check([_staged(0, {"target.full": 2 * GiB}), _staged(1, {"target.full": 3 * GiB})])
    assert check.agree is False
    assert check.disagreeing_stages == ["target.full"]
    assert check.max_spread_bytes == GiB


def test_rank_check_tolerates_what_the_aggregate_tolerates() -> None:
    # 32 MiB apart: under the 64 MiB floor, so the ranks agree by the one rule.
    near = [_staged(0, {"target.full": GiB}), _staged(1, {"target.full": GiB + 32 * 1024**2})]
    assert rank_check(near).agree is True
    assert aggregate_ranks(near).consistent


def test_rank_check_flags_a_stage_only_one_rank_captured() -> None:
    check = rank_check([_staged(0, {"target.full": GiB}), _staged(1, {})])
    assert check.agree is False


def test_rank_check_of_one_rank_has_no_verdict() -> None:
    check = rank_check([_staged(0, {"target.full": GiB})])
    assert check.agree is None and check.ranks_missing == [1]


def _with_available(rank: int, available: int) -> RunReport:
    rep = _rep(rank, 4 * GiB, 1000, world=2)
    return rep.model_copy(
        update={"vllm": VllmFigures(weights_bytes=4 * GiB, available_kv_cache_bytes=available)}
    )


def test_the_rank_with_the_least_kv_memory_binds_the_cache() -> None:
    reports = [_with_available(0, 100 * GiB), _with_available(1, 100 * GiB - 3 * (1 << 20))]
    agg = aggregate_ranks(reports)
    assert agg.binding_rank == 1
    assert rank_check(reports).binding_rank == 1
    # a tie goes to the lowest rank; without the figure nothing binds
    assert aggregate_ranks([_with_available(1, GiB), _with_available(0, GiB)]).binding_rank == 0
    assert aggregate_ranks([_rep(0, GiB, 10, world=1)]).binding_rank is None


def test_a_tp_run_names_what_tp_adds_outside_pytorch_and_flags_no_rank() -> None:
    # TP=2 on an H200 (no GPU recorded: sm90 assumed), hidden unknown: NCCL 24 channels x
    # 12 MiB = 288 MiB, custom all-reduce 10 + 16 MiB, symmetric memory 66 MiB, FlashInfer at
    # its 64 MiB maximum per share: 128 + 2 + 384 MiB.
    mib = 1 << 20
    reports = [
        _rep(r, 4 * GiB, 1000, world=2).model_copy(
            update={"config": RunConfig(model="m", tensor_parallel_size=2)}
        )
        for r in range(2)
    ]
    parallel = run_parallel_bytes(reports)
    assert parallel is not None
    assert parallel.outside_torch_bytes == (288 + 26 + 66 + 514) * mib
    assert aggregate_ranks(reports).consistent  # the same on each rank: it flags no rank
    assert run_parallel_bytes([_rep(r, 4 * GiB, 1000) for r in range(4)]) is None

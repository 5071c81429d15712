"""The planner's fast paths agree with the CudaGraphManager emulation (itself checked against
vLLM 0.33.0 in tests/integration/test_vllm_oracle.py)."""

from __future__ import annotations

import itertools

import pytest

from memest.errors import ConfigError
from memest.plan.vllm033 import (
    capture_sizes,
    decode_query_lens,
    dynamic_sd_lookup,
    dynamic_sd_tiers,
    manager_descriptors,
    uniform_decode_requests,
)

DYN = ((1, 16, 7), (17, 256, 3), (257, 4096, 1))


@pytest.mark.parametrize(
    ("sm100", "seqs", "k", "dyn", "manager_q"),
    [
        (sm100, seqs, k, dyn, mq)
        for sm100, seqs, (k, dyn), mq in itertools.product(
            (True, False),
            (1, 8, 72, 256, 1024),
            ((0, None), (3, None), (5, None), (7, None), (7, DYN), (16, None)),
            ("target", "one", "dspark"),
        )
        if not (k == 0 and mq != "target")
    ],
)
def test_uniform_requests_match_manager(
    sm100: bool, seqs: int, k: int, dyn: tuple[tuple[int, int, int], ...] | None, manager_q: str
) -> None:
    q = {"target": 1 + k, "one": 1, "dspark": k}[manager_q]
    main = capture_sizes(
        sm100=sm100,
        max_num_seqs=seqs,
        max_num_batched_tokens=8192,
        num_speculative_tokens=k,
        dynamic_sd=dyn,
    )
    descs = manager_descriptors(
        sizes=main.sizes,
        max_size=main.max_size,
        max_num_seqs=seqs,
        cudagraph_mode="FULL_DECODE_ONLY",
        decode_query_len=q,
        num_speculative_tokens=k,
        dynamic_sd=dyn,
    )
    for uq in decode_query_lens(q, max_num_seqs=seqs, num_speculative_tokens=k, dynamic_sd=dyn):
        expected = sorted(
            d.num_reqs for d in descs.get("FULL", []) if d.uniform_token_count == uq and d.num_reqs
        )
        fast = uniform_decode_requests(
            main.sizes, max_size=main.max_size, max_num_seqs=seqs, decode_query_len=q, q=uq
        )
        assert fast == expected


def test_dynamic_sd_dense_table_carries_forward() -> None:
    # GIVEN a gap (9..19) and a tail beyond the last range
    dense = dynamic_sd_lookup(((1, 8, 7), (20, 64, 3)), 100, 5)
    # THEN gaps and tail carry the previous K, clamped to K=5
    assert dense[0] == 0
    assert dense[1:9] == [5] * 8
    assert dense[9:20] == [5] * 11
    assert dense[20:] == [3] * 81
    assert dynamic_sd_tiers(((1, 8, 7), (20, 64, 3)), 100, 7) == [(8, 19), (4, 100)]


@pytest.mark.parametrize(
    "schedule",
    [(), ((2, 8, 3),), ((1, 8, 3), (5, 9, 2)), ((1, 0, 3),), ((1, 4, -2),), ((1, 4),)],
)
def test_bad_schedules(schedule: tuple[tuple[int, ...], ...]) -> None:
    with pytest.raises(ConfigError, match="num_speculative_tokens_per_batch_size"):
        dynamic_sd_lookup(schedule, 64, 3)  # type: ignore[arg-type]


def test_interactivity_and_mnbt_in_mains_list() -> None:
    inter = capture_sizes(
        sm100=True,
        max_num_seqs=1024,
        max_num_batched_tokens=16384,
        performance_mode="interactivity",
    )
    assert list(inter.sizes[:32]) == list(range(1, 33))
    assert (
        len(inter.sizes) == 83 - len({1, 2, 4, 8, 16, 24, 32}) + 32
    )  # 1..32 replace 1, 2, 4 and absorb 8..32
    odd = capture_sizes(sm100=False, max_num_seqs=1024, max_num_batched_tokens=300)
    assert odd.max_size == 300 and 300 in odd.sizes

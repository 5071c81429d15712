"""The seed's grid rules (Appendix A c, d and the AV rule) reproduce its published figures."""

from __future__ import annotations

import pytest

from memest.plan.grids import (
    av_grid,
    decode_grid,
    decode_stride,
    pow2_floor,
    prefill_grid,
    prefill_stride,
)
from memest.plan.vllm033 import capture_sizes


def test_prefill_grid_at_8192_has_39_sizes_summing_127487() -> None:
    # GIVEN the PIECEWISE rule WHEN expanded to the default cap
    grid = prefill_grid(8192)
    # THEN the seed's figures come out
    assert len(grid) == 39
    assert sum(grid) == 127_487
    assert grid[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert grid[-3:] == [7424, 7680, 8192]
    assert all(b - a == 256 for a, b in zip(grid[8:-2], grid[9:-1], strict=True))


def test_prefill_strides_match_the_worked_examples() -> None:
    # Appendix A d: t=4096 → 286.72 → 256; t=7680 → 537.6 → 512, next size 8192
    assert prefill_stride(4096) == 256
    assert prefill_stride(7680) == 512
    assert prefill_stride(100) == 64
    assert pow2_floor(286.72) == 256


def test_prefill_grid_always_includes_an_off_grid_cap() -> None:
    assert prefill_grid(1000)[-2:] == [768, 1000]
    assert prefill_grid(1) == [1]


def test_interactivity_mode_has_65_prefill_sizes() -> None:
    grid = prefill_grid(8192, interactivity=True)
    assert len(grid) == 65
    assert grid[:32] == list(range(1, 33))


def test_decode_grid_64_to_1024_48_to_512_37_to_256() -> None:
    # GIVEN Δ(n) = 10·ε·n^(2/3), ε = 0.065, rounded down to a power of two
    full = decode_grid(1024)
    # THEN 64 sizes to 1024, every count through 6, every power of two present
    assert len(full) == 64
    assert full[:7] == [1, 2, 3, 4, 5, 6, 8]
    assert {1 << i for i in range(11)} <= set(full)
    assert len(decode_grid(512)) == 48  # K=7 under the 4096-token budget
    assert len(decode_grid(256)) == 37  # K=15, and 256 sequences without SD
    assert decode_stride(6) == 2


def test_dspark_cap_585_gives_51_sizes() -> None:
    grid = decode_grid(4096 // 7)
    assert len(grid) == 51
    assert grid[-4:] == [512, 544, 576, 585]


def test_av_grid_64_sizes_to_6144_and_28_to_498() -> None:
    grid = av_grid(1024 * 6)
    assert len(grid) == 64
    assert grid[-1] == 6144
    assert grid[:8] == [1, 2, 4, 8, 10, 12, 14, 16]
    assert 4096 in grid and 4352 in grid and 4224 not in grid
    assert len(av_grid(498)) == 28
    assert len(av_grid(258)) == 25  # legacy power-of-two list at K=5


def test_main_list_83_sizes_to_1024_summing_35335() -> None:
    main = capture_sizes(sm100=True, max_num_seqs=1024, max_num_batched_tokens=16384)
    assert len(main.sizes) == 83
    assert main.max_size == 1024
    assert sum(main.sizes) == 35_335


@pytest.mark.parametrize("cap", [1, 2, 3, 7, 100, 585, 1024, 3000])
def test_grids_are_strictly_ascending_and_end_at_cap(cap: int) -> None:
    for grid in (prefill_grid(cap), decode_grid(cap), av_grid(cap)):
        assert grid[-1] == cap
        assert all(a < b for a, b in zip(grid, grid[1:], strict=False))

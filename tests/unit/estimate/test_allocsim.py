"""The caching-allocator model on small sequences; every expectation is worked from the rules.

Rules (c10/cuda/CUDACachingAllocator.cpp): 512 B rounding; <= 1 MiB small pool in 2 MiB
segments; 1-10 MiB requests get 20 MiB segments, >= 10 MiB the request rounded to 2 MiB; best fit
by (stream, size, address); small blocks split when >= 512 B remain, large when > 1 MiB remains;
freed blocks merge with free neighbours.
"""

from __future__ import annotations

import pytest

from memest.errors import InvariantError
from memest.estimate.allocsim import PoolSim, round_size, segment_size
from memest.units import MiB

KiB = 1024


@pytest.mark.parametrize(
    ("size", "rounded"), [(1, 512), (511, 512), (512, 512), (513, 1024), (MiB + 1, MiB + 512)]
)
def test_round_size(size: int, rounded: int) -> None:
    assert round_size(size) == rounded


@pytest.mark.parametrize(
    ("rounded", "segment"),
    [
        (512, 2 * MiB),
        (MiB, 2 * MiB),  # still small: <= kSmallSize
        (MiB + 512, 20 * MiB),
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),  # from kMinLargeAlloc on, the request rounded to 2 MiB
        (11 * MiB, 12 * MiB),
    ],
)
def test_segment_size(rounded: int, segment: int) -> None:
    assert segment_size(rounded) == segment


def test_small_block_splits_when_512_bytes_remain() -> None:
    # 1 MiB, then 1 MiB - 512 B in the same 2 MiB small segment leaves 512 B: split off, so a
    # 512 B request fits there; one more request needs a second segment.
    sim = PoolSim()
    sim.alloc(1, MiB, 0)
    sim.alloc(2, MiB - 512, 0)
    assert sim.free_blocks() == [(0, 512, 2 * MiB - 512)]
    sim.alloc(3, 1, 0)
    assert sim.segments == [2 * MiB]
    sim.alloc(4, 1, 0)
    assert sim.segments == [2 * MiB, 2 * MiB]


def test_best_fit_ties_go_to_the_lower_address() -> None:
    sim = PoolSim()
    for h in range(4):
        sim.alloc(h, 4 * MiB, 0)  # 4 x 4 MiB at 0, 4, 8, 12 MiB; 4 MiB free at 16 MiB
    sim.free(0)
    sim.free(2)
    # Free: 4 MiB at 0, 8 MiB and 16 MiB. A 3.5 MiB request takes the lowest: 0 (0.5 MiB left is
    # not > 1 MiB, so the whole block goes).
    sim.alloc(9, 3 * MiB + 512 * KiB, 0)
    assert sorted(a for _, _, a in sim.free_blocks()) == [8 * MiB, 16 * MiB]


def test_free_of_unknown_handle_is_ignored_and_double_alloc_is_refused() -> None:
    sim = PoolSim()
    sim.free(42)
    sim.alloc(1, 512, 0)
    with pytest.raises(InvariantError, match="already live"):
        sim.alloc(1, 512, 0)


def test_seeded_segment_free_block_is_reused_before_a_new_segment() -> None:
    # A 20 MiB segment from before the sequence: 4 MiB held, 16 MiB free above it.
    base = 1 << 40
    sim = PoolSim()
    sim.seed_segment([(base, 4 * MiB, True), (base + 4 * MiB, 16 * MiB, False)])
    sim.alloc(1, 12 * MiB, 0)  # fits the free 16 MiB block (split: 4 MiB > 1 MiB remains)
    sim.alloc(2, 3 * MiB, 0)  # the 4 MiB remainder
    assert sim.result().segments == []
    sim.alloc(3, 12 * MiB, 0)  # nothing free: a new segment, counted
    assert sim.result().segments == [12 * MiB]
    sim.free(1)  # merges back with its free neighbours only, never with the held block
    assert (0, 12 * MiB, base + 4 * MiB) in sim.free_blocks()


def test_a_held_block_in_a_cached_segment_makes_the_next_large_request_reserve() -> None:
    """Fragmentation from a cached state: a small request best-fit into a freed large block
    splits it, and the large request that follows needs a segment of its own."""
    base = 1 << 40
    sim = PoolSim()
    sim.seed_segment([(base, 128 * MiB, False)])
    sim.alloc(1, 16 * MiB, 0)  # the only free large block: split off the 128 MiB segment
    sim.alloc(2, 120 * MiB, 0)
    assert sim.result().segments == [120 * MiB]


def test_seeded_blocks_must_be_contiguous() -> None:
    with pytest.raises(InvariantError):
        PoolSim().seed_segment([(0, 2 * MiB, False), (4 * MiB, 2 * MiB, False)])
    with pytest.raises(InvariantError):
        PoolSim().seed_segment([])

"""A model of PyTorch's CUDA caching allocator for one private (graph) pool; pure Python, no torch.

Pool growth under CUDA-graph capture is made of segments, not of bytes: a request that finds no
free block makes the allocator reserve a whole segment (2 MiB, 20 MiB or the request rounded to
2 MiB), and later requests reuse it. Scaling measured bytes by a ratio therefore misses by up to a
segment per trigger; replaying the request sequence through the allocator's rules does not.

Rules of ``c10/cuda/CUDACachingAllocator.cpp`` (native backend, expandable_segments off, no
max_split_size, so the "oversize" rules never apply):

- round_size: requests are rounded up to a multiple of 512 B (at least 512 B);
- get_pool: a rounded size <= 1 MiB (kSmallSize) goes to the small pool, larger to the large pool;
- get_allocation_size: a new small-pool segment is 2 MiB; a large request < 10 MiB gets a 20 MiB
  segment; a request >= 10 MiB gets itself rounded up to 2 MiB;
- get_free_block: best fit, the free block of the same pool and stream with the smallest size
  that fits, ties broken by the lower address (std::set ordered by stream, size, address);
- should_split: a small-pool block splits when the remainder is >= 512 B, a large-pool block when
  the remainder is > 1 MiB; the remainder stays free at the higher address;
- free_block: a freed block merges with its free neighbours in the same segment.

Segments of a private pool are never released while graphs are being captured, so the pool only
grows. Events are fed in trace order; a free makes its block reusable at once (in the trace the
moment is ``free_completed``: a block used on another stream completes its free later).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from memest.errors import InvariantError

MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_SIZE_BYTES = 1 << 20  # kSmallSize: largest small-pool request
SMALL_BUFFER_BYTES = 2 << 20  # kSmallBuffer: small-pool segment
MIN_LARGE_ALLOC_BYTES = 10 << 20  # kMinLargeAlloc: from here a segment fits the request
LARGE_BUFFER_BYTES = 20 << 20  # kLargeBuffer: segment for 1-10 MiB requests
ROUND_LARGE_BYTES = 2 << 20  # kRoundLarge


def round_size(size: int) -> int:
    """Bytes the allocator hands out for a request of ``size`` bytes (round_size)."""
    if size < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return MIN_BLOCK_BYTES * ((size + MIN_BLOCK_BYTES - 1) // MIN_BLOCK_BYTES)


def segment_size(rounded: int) -> int:
    """Bytes of the segment reserved for a rounded request that found no free block."""
    if rounded <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if rounded < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return ROUND_LARGE_BYTES * ((rounded + ROUND_LARGE_BYTES - 1) // ROUND_LARGE_BYTES)


def should_split(small: bool, block_bytes: int, rounded: int) -> bool:
    """Whether a free block of ``block_bytes`` is split to serve ``rounded`` bytes."""
    remaining = block_bytes - rounded
    if small:
        return remaining >= MIN_BLOCK_BYTES
    return remaining > SMALL_SIZE_BYTES


@dataclass(frozen=True, slots=True)
class Trigger:
    """A request that made the simulated allocator reserve a segment."""

    request_bytes: int
    segment_bytes: int
    event_index: int


@dataclass(frozen=True, slots=True)
class SimResult:
    """What the pool reserved: total, each segment in order, and what triggered each."""

    reserved_bytes: int
    segments: list[int] = field(default_factory=list)
    triggers: list[Trigger] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Block:
    addr: int
    size: int
    stream: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None


class PoolSim:
    """The allocator state of one private pool; feed it events with :meth:`apply`."""

    def __init__(self) -> None:
        # Free blocks per pool kind, as sorted (stream, size, addr) keys: get_free_block's order.
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._free_at: dict[int, _Block] = {}  # free blocks by address
        self._live: dict[int, _Block] = {}
        self._next_addr = 0
        self.segments: list[int] = []
        self.triggers: list[Trigger] = []

    def free_blocks(self) -> list[tuple[int, int, int]]:
        """Free blocks as (stream, size, address), small pool first: what best fit searches."""
        return [*self._free[True], *self._free[False]]

    def result(self) -> SimResult:
        return SimResult(sum(self.segments), list(self.segments), list(self.triggers))

    def seed_segment(
        self, blocks: Sequence[tuple[int, int, bool]], *, stream: int = 0, small: bool = False
    ) -> None:
        """Add a segment that exists before the sequence begins, with its blocks in order.

        ``blocks`` are (address, size, allocated), contiguous: a snapshot's segment. Its free
        blocks are reusable at once; its allocated blocks stay held (a free in the sequence
        cannot name them). The segment is not counted in :meth:`result`, which reports what
        the sequence adds. New segments are placed above it.

        Raises:
            InvariantError: the blocks are empty or not contiguous.
        """
        if not blocks:
            raise InvariantError("a seeded segment needs at least one block")
        prev: _Block | None = None
        for addr, size, allocated in blocks:
            if prev is not None and prev.addr + prev.size != addr:
                raise InvariantError(f"seeded block {addr:#x} does not follow {prev.addr:#x}")
            block = _Block(addr, size, stream, small, allocated, prev)
            if prev is not None:
                prev.next = block
            if not allocated:
                self._insert_free(block)
            prev = block
        assert prev is not None
        self._next_addr = max(self._next_addr, prev.addr + prev.size + ROUND_LARGE_BYTES)

    def alloc(self, handle: int, size: int, stream: int, index: int = -1) -> None:
        """Serve a request; reserve a segment when no free block fits.

        Raises:
            InvariantError: ``handle`` is already live (a free is missing in the sequence).
        """
        if handle in self._live:
            raise InvariantError(f"allocation {handle:#x} is already live (event {index})")
        rounded = round_size(size)
        small = rounded <= SMALL_SIZE_BYTES
        block = self._take_free(small, stream, rounded)
        if block is None:
            seg = segment_size(rounded)
            # Addresses only order ties in best fit; segments never touch, so none merge.
            block = _Block(self._next_addr, seg, stream, small)
            self._next_addr += seg + ROUND_LARGE_BYTES
            self.segments.append(seg)
            self.triggers.append(Trigger(size, seg, index))
        if should_split(small, block.size, rounded):
            rest = _Block(block.addr + rounded, block.size - rounded, stream, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self._insert_free(rest)
        block.allocated = True
        self._live[handle] = block

    def free(self, handle: int) -> None:
        """Return an allocation's block to the pool, merged with its free neighbours.

        A free of a handle that is not live is ignored: it ends an allocation made before the
        sequence began (outside this pool's replay).
        """
        block = self._live.pop(handle, None)
        if block is None:
            return
        block.allocated = False
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                self._remove_free(other)
                if other is block.prev:
                    block.addr, block.prev = other.addr, other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                block.size += other.size
        self._insert_free(block)

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.stream, block.size, block.addr))
        self._free_at[block.addr] = block

    def _remove_free(self, block: _Block) -> None:
        keys = self._free[block.small]
        i = bisect.bisect_left(keys, (block.stream, block.size, block.addr))
        del keys[i]
        del self._free_at[block.addr]

    def _take_free(self, small: bool, stream: int, rounded: int) -> _Block | None:
        keys = self._free[small]
        i = bisect.bisect_left(keys, (stream, rounded, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        _, _, addr = keys.pop(i)
        return self._free_at.pop(addr)

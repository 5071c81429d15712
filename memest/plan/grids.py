"""The seed's capture grids (Appendix A).

Every grid is a sorted list of distinct positive ints in its own unit (tokens for prefill and
adaptive verification, requests for uniform decode). A grid always contains its cap: the widest
batch the cap admits must have a graph, otherwise the cap would silently shrink. Each rule is a
pure function of its cap, so expansions are memoized (callers get a fresh list).
"""

from __future__ import annotations

import math
from functools import lru_cache

#: ε of the decode rule (Appendix A c): Δ(n) = 10·ε·n^(2/3), e ≈ n^(1/3)/5 over all measured models.
DECODE_EPSILON = 0.065
#: ε of the PIECEWISE rule (Appendix A d); the stride coefficient is 2·ε = 0.07.
PREFILL_EPSILON = 0.035
#: Below this many tokens PIECEWISE step time is flat: e_PW(t) = min(1, t / 4096).
PREFILL_FLAT_TOKENS = 4096
#: Interactivity mode adds every token count up to this one to the prefill grid.
INTERACTIVITY_DENSE_TOKENS = 32


def pow2_floor(x: float) -> int:
    """Largest power of two ≤ ``x``; 1 for ``x`` < 2."""
    if x < 2:
        return 1
    return 1 << (math.floor(x).bit_length() - 1)


def _next_multiple(t: int, stride: int) -> int:
    return (t // stride + 1) * stride


def prefill_stride(t: int) -> int:
    """PIECEWISE grid stride after ``t`` tokens: min(t, 2ε·max(t, 4096)) rounded down to a power of 2."""
    return pow2_floor(min(t, 2 * PREFILL_EPSILON * max(t, PREFILL_FLAT_TOKENS)))


@lru_cache(maxsize=1024)
def _prefill_grid(cap: int, interactivity: bool) -> tuple[int, ...]:
    sizes: set[int] = set()
    t = 1
    while t < cap:
        sizes.add(t)
        t = _next_multiple(t, prefill_stride(t))
    sizes.add(cap)
    if interactivity:
        sizes.update(range(1, min(cap, INTERACTIVITY_DENSE_TOKENS) + 1))
    return tuple(sorted(sizes))


def prefill_grid(cap: int, *, interactivity: bool = False) -> list[int]:
    """The seed's PIECEWISE token grid up to ``cap`` (Appendix A d).

    Starting at 1, the next size is the next multiple of ``prefill_stride(t)``; ``cap`` is always
    included. At cap 8192 this gives 39 sizes summing to 127,487 tokens.

    Args:
        cap: max_prefill_cudagraph_capture_tokens (≥ 1).
        interactivity: add every token count up to 32 (65 sizes at cap 8192).
    """
    return list(_prefill_grid(cap, interactivity))


def decode_stride(n: int) -> int:
    """Uniform-decode grid stride after ``n`` requests: 10·ε·n^(2/3) rounded down to a power of 2."""
    return pow2_floor(10 * DECODE_EPSILON * n ** (2.0 / 3.0))


@lru_cache(maxsize=4096)
def _decode_grid(cap: int) -> tuple[int, ...]:
    sizes: list[int] = []
    n = 1
    while n < cap:
        sizes.append(n)
        n = _next_multiple(n, decode_stride(n))
    sizes.append(cap)
    return tuple(sizes)


def decode_grid(cap: int) -> list[int]:
    """The seed's uniform-decode request grid up to ``cap`` (Appendix A c).

    Every request count through 6, then power-of-two strides growing as n^(2/3); the next size is
    the next multiple of the stride and ``cap`` is always included: 64 sizes at 1024.
    """
    return list(_decode_grid(cap))


def av_stride(t: int) -> int:
    """Adaptive-verification grid stride after ``t`` tokens.

    1, 2, 4, 8; then four sizes per doubling through 1024; every 128 through 4096; every 256 above.
    """
    if t < 8:
        return t
    if t < 1024:
        return pow2_floor(t / 4)
    if t < 4096:
        return 128
    return 256


@lru_cache(maxsize=4096)
def _av_grid(cap: int) -> tuple[int, ...]:
    sizes: list[int] = []
    t = 1
    while t < cap:
        sizes.append(t)
        t = _next_multiple(t, av_stride(t))
    sizes.append(cap)
    return tuple(sizes)


def av_grid(cap: int) -> list[int]:
    """The seed's dense adaptive-verification token grid up to ``cap``, cap included.

    At K = 5 on GB200 defaults the cap is 1024 requests × 6 = 6144 tokens: 64 sizes.
    """
    return list(_av_grid(cap))

"""Expected padding of a capture grid for a distribution of batch sizes.

A batch runs on the smallest captured size that holds it and pads the difference; a batch wider
than the widest size runs without a graph (eager or another runner), so it pads nothing and is
counted apart.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memest.errors import ConfigError


@dataclass(frozen=True)
class PaddingCost:
    """Expected padding per step.

    Attributes:
        mean_real_tokens: expected real tokens per step (all batches).
        mean_padded_tokens: expected tokens per step after padding (eager batches unpadded).
        mean_padding_tokens: mean_padded_tokens − mean_real_tokens.
        padding_ratio: padding over the real tokens of graph-covered batches only.
        overall_padding_ratio: mean_padding_tokens / mean_real_tokens over every batch (a batch
            beyond the grid runs unpadded, so this is at most padding_ratio).
        eager_fraction: probability that a batch is wider than the grid.
    """

    mean_real_tokens: float
    mean_padded_tokens: float
    mean_padding_tokens: float
    padding_ratio: float
    eager_fraction: float
    overall_padding_ratio: float = 0.0


def uniform_histogram(low: int, high: int) -> dict[int, float]:
    """Every batch size from ``low`` to ``high`` equally likely."""
    if low < 1 or high < low:
        raise ConfigError("batch_sizes", (low, high), "need 1 <= low <= high")
    return {n: 1.0 for n in range(low, high + 1)}


def expected_padding(
    grid: Sequence[int], histogram: Mapping[int, float], *, q: int = 1
) -> PaddingCost:
    """Expected padded tokens per step for ``grid`` under a batch-size ``histogram``.

    Args:
        grid: captured sizes, in the histogram's unit (tokens, or requests for a decode grid).
        histogram: batch size → weight (need not be normalized).
        q: tokens per unit (q = 1 + K for a request grid of uniform decodes; 1 for tokens).

    Raises:
        ConfigError: an empty histogram, a negative weight, a non-positive size, or q < 1.
    """
    if q < 1:
        raise ConfigError("q", q, "must be >= 1")
    if not histogram:
        raise ConfigError("histogram", {}, "must not be empty")
    total = 0.0
    for size, weight in histogram.items():
        if size < 1:
            raise ConfigError("histogram", size, "batch sizes must be >= 1")
        if weight < 0:
            raise ConfigError("histogram", weight, f"weight of {size} must be >= 0")
        total += weight
    if total <= 0:
        raise ConfigError("histogram", dict(histogram), "weights sum to zero")
    sizes = sorted(set(grid))
    real = padded = covered_real = covered_pad = eager = 0.0
    for size, weight in histogram.items():
        p = weight / total
        i = bisect.bisect_left(sizes, size)
        real += p * size * q
        if i == len(sizes):
            eager += p
            padded += p * size * q
            continue
        padded += p * sizes[i] * q
        covered_real += p * size * q
        covered_pad += p * (sizes[i] - size) * q
    return PaddingCost(
        mean_real_tokens=real,
        mean_padded_tokens=padded,
        mean_padding_tokens=padded - real,
        padding_ratio=covered_pad / covered_real if covered_real else 0.0,
        eager_fraction=eager,
        overall_padding_ratio=(padded - real) / real if real else 0.0,
    )

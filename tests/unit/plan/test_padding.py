"""Expected padding per step, by hand-computed cases."""

from __future__ import annotations

import pytest

from memest.errors import ConfigError
from memest.plan import decode_grid, expected_padding, prefill_grid, uniform_histogram


def test_uniform_over_a_two_size_grid() -> None:
    # GIVEN grid [2, 4] and batches 1..4 equally likely
    cost = expected_padding([2, 4], uniform_histogram(1, 4))
    # THEN 1→2, 2→2, 3→4, 4→4: padded mean 3, real mean 2.5
    assert cost.mean_padded_tokens == pytest.approx(3.0)
    assert cost.mean_padding_tokens == pytest.approx(0.5)
    assert cost.padding_ratio == pytest.approx(0.2)
    assert cost.eager_fraction == 0.0


def test_request_grid_scales_by_q_and_counts_eager() -> None:
    # GIVEN a request grid [1, 4] at q=8 and a histogram with a batch wider than the grid
    cost = expected_padding([1, 4], {3: 1.0, 6: 1.0}, q=8)
    # THEN 3 requests pad to 4 (8 tokens of padding), 6 runs eagerly (no padding)
    assert cost.eager_fraction == pytest.approx(0.5)
    assert cost.mean_real_tokens == pytest.approx((24 + 48) / 2)
    assert cost.mean_padding_tokens == pytest.approx(4.0)
    assert cost.padding_ratio == pytest.approx(8 / 24)


def test_denser_grid_pads_less() -> None:
    hist = uniform_histogram(1, 1024)
    dense = expected_padding(list(range(1, 1025)), hist)
    coarse = expected_padding(decode_grid(1024), hist)
    assert dense.mean_padding_tokens == 0.0
    assert 0 < coarse.padding_ratio < 0.1  # ε-bounded grid: a few percent
    assert expected_padding(prefill_grid(8192), uniform_histogram(1, 8192)).eager_fraction == 0.0


@pytest.mark.parametrize(
    ("grid", "hist", "q"),
    [([1], {}, 1), ([1], {0: 1.0}, 1), ([1], {1: -1.0}, 1), ([1], {1: 0.0}, 1), ([1], {1: 1.0}, 0)],
)
def test_bad_distributions(grid: list[int], hist: dict[int, float], q: int) -> None:
    with pytest.raises(ConfigError):
        expected_padding(grid, hist, q=q)

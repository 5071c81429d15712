from __future__ import annotations

import pytest

from memest.estimate import extrapolate_full_graph_memory, vllm_cudagraph_estimate
from memest.units import GiB, MiB


def test_extrapolation_floors_the_second_sample_at_one_mib() -> None:
    assert extrapolate_full_graph_memory([GiB, MiB // 4], 51) == GiB + 50 * MiB
    assert extrapolate_full_graph_memory([GiB, 3 * MiB], 10) == GiB + 27 * MiB
    assert extrapolate_full_graph_memory([GiB], 10) == GiB
    assert extrapolate_full_graph_memory([], 10) == 0


def test_estimate_swaps_samples_for_the_extrapolation() -> None:
    # measured 3 GiB includes both samples; they are replaced by 1 GiB + 50 x 1 MiB
    assert vllm_cudagraph_estimate(3 * GiB, [GiB, MiB // 4], 51) == 3 * GiB + 50 * MiB - MiB // 4
    # Samples above the measured total leave only the extrapolation's floor
    assert vllm_cudagraph_estimate(0, [GiB, 0], 2) == MiB
    assert vllm_cudagraph_estimate(0, [2 * GiB, 0], 1) == 0


@pytest.mark.vllm
def test_matches_vllm_own_extrapolation() -> None:
    try:
        from vllm.v1.worker.gpu.cudagraph_utils import _extrapolate_full_graph_memory
    except ImportError:
        from tests.conftest import require_or_skip

        require_or_skip("MEMEST_REQUIRE_VLLM", "vLLM 0.33.0 is not installed")
        return
    cases = [
        ([GiB, MiB // 4], 51),
        ([GiB, 3 * MiB], 10),
        ([GiB], 7),
        ([-GiB, 5 * MiB], 30),
        ([], 4),
    ]
    for samples, n in cases:
        assert extrapolate_full_graph_memory(samples, n) == _extrapolate_full_graph_memory(
            list(samples), n
        )

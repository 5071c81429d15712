from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memest.estimate import compare, record
from memest.schema import RunReport
from memest.units import GiB, MiB

Factory = Callable[[], dict[str, Any]]


def test_three_records_side_by_side(make_report: Factory) -> None:
    comparison = compare(RunReport.model_validate(make_report()))
    assert comparison.requested_bytes == 90 * GiB
    assert [r.estimator for r in comparison.records] == ["vllm", "memest", "measured"]

    measured = record(comparison, "measured")
    assert measured is not None
    assert measured.kv_cache_bytes == 30_000 * 2 * MiB
    assert measured.kv_tokens == 480_000
    # end usage 81.40625 GiB - 90 GiB
    assert measured.usage_minus_budget_bytes == -(8 * GiB + 608 * MiB)

    memest = record(comparison, "memest")
    assert memest is not None
    # 90 - (16 + 3 + 1.25 + 2 + 0.5 + 0.0625) = 67.1875 GiB = 34,400 blocks of 2 MiB
    assert memest.kv_cache_bytes == 68_800 * MiB
    assert memest.kv_tokens == 34_400 * 16
    assert memest.cudagraph_estimate_bytes == 2 * GiB
    # The terms explain the end state exactly, so memest's KV cache would fill the budget.
    assert memest.usage_minus_budget_bytes == 0

    vllm = record(comparison, "vllm")
    assert vllm is not None
    # 3 GiB - (1 GiB + 0.25 MiB) + (1 GiB + 50 x 1 MiB)
    assert vllm.cudagraph_estimate_bytes == 3 * GiB + 50 * MiB - MiB // 4
    # 90 - 19 - that = 69,582.25 MiB; whole blocks: 34,791
    assert vllm.kv_cache_bytes == 69_582 * MiB + MiB // 4
    assert vllm.kv_tokens == 34_791 * 16
    # non-KV retained 23,360 MiB + 69,582 MiB of blocks - 92,160 MiB
    assert vllm.usage_minus_budget_bytes == 782 * MiB


def test_components_sum_to_memest_non_kv(make_report: Factory) -> None:
    comparison = compare(RunReport.model_validate(make_report()), margin_bytes=64 * MiB)
    memest = record(comparison, "memest")
    assert memest is not None
    assert sum(comparison.components.values()) == memest.non_kv_cache_bytes
    assert comparison.components["margin_bytes"] == 64 * MiB
    assert comparison.startup_plan is not None
    assert comparison.startup_plan.fingerprint == "0123456789abcdef"


def test_vllm_record_from_logged_estimate(make_report: Factory) -> None:
    data = make_report()
    data["estimate"] = None
    data["vllm"]["cudagraph_estimate_bytes"] = GiB
    vllm = record(compare(RunReport.model_validate(data)), "vllm")
    assert vllm is not None
    assert vllm.kv_cache_bytes == 70 * GiB


def test_vllm_record_without_figures_says_so(make_report: Factory) -> None:
    data = make_report()
    data["estimate"] = None
    data["vllm"] = {"requested_memory_bytes": 90 * GiB}
    vllm = record(compare(RunReport.model_validate(data)), "vllm")
    assert vllm is not None
    assert vllm.kv_cache_bytes is None
    assert "missing" in vllm.note


def test_free_space_in_graph_pools_does_not_serve_the_activation_peak(
    make_report: Factory,
) -> None:
    data = make_report()
    end = data["phases"][-1]["end"]
    # Of the 4.5 GiB the allocator holds free at the end, 2 GiB are the capture pool's (no live
    # blocks): only 2.5 GiB can take the 3 GiB activation peak, so 0.5 GiB of it is new usage.
    end["pool_reserved_bytes"] = {"0,0": end["torch_reserved_bytes"] - 2 * GiB, "0,1": 2 * GiB}
    data["breakdown"]["retained"] = [
        {"stage": "capture", "owner": "graph_pool_live_blocks", "bytes": 0}
    ]
    measured = record(compare(RunReport.model_validate(data)), "measured")
    assert measured is not None
    assert measured.usage_minus_budget_bytes == -(8 * GiB + 608 * MiB) + GiB // 2


def test_allocations_kept_after_the_kv_cache_are_a_term_when_pool_blocks_are_known(
    make_report: Factory,
) -> None:
    data = make_report()
    # Capture grew allocated bytes by 0.5 GiB; 0.25 GiB of it are live blocks of the graph pool
    # (already in the pool's reservation), so 0.25 GiB are default-pool buffers the graphs keep.
    data["breakdown"]["retained"] = [
        {"stage": "capture", "owner": "graph_pool_live_blocks", "bytes": GiB // 4}
    ]
    terms = compare(RunReport.model_validate(data)).full_init
    assert terms is not None
    assert terms.runner_buffer_bytes == GiB // 2 + GiB // 4
    without = compare(RunReport.model_validate(make_report())).full_init
    assert without is not None and without.runner_buffer_bytes == GiB // 2

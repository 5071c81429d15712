from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from memest.errors import InvariantError, ReportFormatError
from memest.estimate import FullInitTerms, full_init_kv_budget, full_init_terms, non_kv_bytes
from memest.schema import RunReport
from memest.units import GiB, MiB

Factory = Callable[[], dict[str, Any]]


def test_terms_read_from_phases_and_stage_rows(make_report: Factory) -> None:
    terms = full_init_terms(RunReport.model_validate(make_report()))
    assert terms.requested_bytes == 90 * GiB
    assert terms.weights_bytes == 16 * GiB
    assert terms.profile_peak_activation_bytes == 3 * GiB
    assert terms.outside_torch_bytes == GiB + GiB // 4
    # Capture-phase stage rows only; the 5 GiB throwaway profiling row is not retained memory.
    assert terms.graph_pool_by_stage_bytes == {
        "target.piecewise": 240 * MiB,
        "target.full": 610 * MiB,
        "draft.block.full": 1198 * MiB,
    }
    assert terms.graph_pool_bytes == 2 * GiB
    assert terms.runner_buffer_bytes == GiB // 2
    assert terms.profiling_residue_bytes == 64 * MiB


def test_budget_is_requested_minus_every_term(make_report: Factory) -> None:
    terms = full_init_terms(RunReport.model_validate(make_report()), margin_bytes=256 * MiB)
    # 16 + 3 + 1.25 + 2 + 0.5 + 0.0625 + 0.25 = 23.0625 GiB
    assert non_kv_bytes(terms) == 23 * GiB + 64 * MiB
    assert full_init_kv_budget(terms) == 90 * GiB - 23 * GiB - 64 * MiB


def test_budget_never_negative() -> None:
    terms = FullInitTerms(
        requested_bytes=GiB,
        weights_bytes=2 * GiB,
        profile_peak_activation_bytes=0,
        outside_torch_bytes=0,
        graph_pool_bytes=0,
    )
    assert full_init_kv_budget(terms) == 0


def test_stage_split_must_sum_to_graph_pool() -> None:
    terms = FullInitTerms(
        requested_bytes=10 * GiB,
        weights_bytes=GiB,
        profile_peak_activation_bytes=0,
        outside_torch_bytes=0,
        graph_pool_bytes=GiB,
        graph_pool_by_stage_bytes={"target.piecewise": GiB // 2},
    )
    with pytest.raises(InvariantError, match="sums to 536870912"):
        full_init_kv_budget(terms)


def test_negative_term_is_refused() -> None:
    with pytest.raises(ValidationError, match="weights_bytes"):
        FullInitTerms(
            requested_bytes=GiB,
            weights_bytes=-1,
            profile_peak_activation_bytes=0,
            outside_torch_bytes=0,
            graph_pool_bytes=0,
        )


@pytest.mark.parametrize("missing", ["weights", "profile_run", "kv_cache_alloc"])
def test_missing_phase_is_named(make_report: Factory, missing: str) -> None:
    data = make_report()
    data["phases"] = [p for p in data["phases"] if p["name"] != missing]
    with pytest.raises(ReportFormatError, match=f"phase '{missing}' is missing"):
        full_init_terms(RunReport.model_validate(data))


def test_no_end_state_is_named(make_report: Factory) -> None:
    data = make_report()
    data["phases"] = [p for p in data["phases"] if p["name"] not in ("capture", "end")]
    with pytest.raises(ReportFormatError, match="neither phase 'capture' nor 'end'"):
        full_init_terms(RunReport.model_validate(data))


def test_budget_from_utilization_when_vllm_figures_absent(make_report: Factory) -> None:
    data = make_report()
    data["vllm"] = None
    data["config"]["gpu_memory_utilization"] = 0.5
    assert full_init_terms(RunReport.model_validate(data)).requested_bytes == 50 * GiB


def test_missing_kv_spec_is_named(make_report: Factory) -> None:
    data = make_report()
    data["kv_cache"] = None
    with pytest.raises(ReportFormatError, match="kv_cache spec with num_blocks is missing"):
        full_init_terms(RunReport.model_validate(data))


def test_missing_device_reading_is_named(make_report: Factory) -> None:
    data = make_report()
    data["phases"][-1]["end"]["device_used_bytes"] = None
    with pytest.raises(ReportFormatError, match="no device_used_bytes"):
        full_init_terms(RunReport.model_validate(data))


def test_other_schema_version_is_refused(make_report: Factory) -> None:
    report = RunReport.model_validate(make_report())
    object.__setattr__(report, "schema_version", "2")
    with pytest.raises(ReportFormatError, match="schema_version '2'"):
        full_init_terms(report)


def test_allocator_reservation_before_weights_is_a_term(make_report: Factory) -> None:
    # cuBLAS workspaces from the device-init matmul: reserved before the weights phase starts.
    data = make_report()
    for phase in data["phases"]:
        for edge in ("start", "end"):
            phase[edge]["torch_reserved_bytes"] += 32 * MiB
            phase[edge]["torch_allocated_bytes"] += 32 * MiB
            phase[edge]["torch_allocated_peak_bytes"] += 32 * MiB
            phase[edge]["device_used_bytes"] += 32 * MiB
    terms = full_init_terms(RunReport.model_validate(data))
    assert terms.baseline_torch_bytes == 32 * MiB
    assert terms.weights_bytes == 16 * GiB
    assert terms.outside_torch_bytes == GiB + GiB // 4
    assert non_kv_bytes(terms) == 22 * GiB + 832 * MiB + 32 * MiB

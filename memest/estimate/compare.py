"""Estimates side by side for one start: vLLM's own, memest's full-initialization one, measured."""

from __future__ import annotations

from memest.estimate.kv import config_kv_tokens, kv_cache_bytes, require_fit
from memest.estimate.phases import (
    device_used,
    final_reading,
    full_init_kv_budget,
    measured_kv_bytes,
    non_kv_bytes,
    terms_components,
)
from memest.estimate.terms.catalog import full_init_terms
from memest.estimate.vllm_estimate import vllm_cudagraph_estimate
from memest.schema import (
    EstimateComparison,
    EstimateRecord,
    FullInitTerms,
    KVCacheSpec,
    MemoryReading,
    RunReport,
)
from memest.snapshot.tags import DEFAULT_POOL


def default_pool_cached(report: RunReport, end: MemoryReading) -> int:
    """Free bytes the allocator holds in its default pool at ``end``: what eager work reuses.

    A free block serves only requests on the stream it was made on, so where the reading has
    the free bytes on the stream vLLM serves on (``serving_stream_free_bytes``), that is the
    figure: what the capture streams, gone after init, left free stays unused. Else, from the
    totals: free space inside graph pools is kept for replays and never serves eager
    allocations, so it is taken out (the pools' live blocks, when the breakdown has them,
    stay counted).
    """
    if end.serving_stream_free_bytes is not None:
        return end.serving_stream_free_bytes
    private = sum(v for k, v in end.pool_reserved_bytes.items() if k != DEFAULT_POOL)
    live = 0
    if report.breakdown is not None:
        live = sum(
            r.bytes for r in report.breakdown.retained if r.owner == "graph_pool_live_blocks"
        )
    free = end.torch_reserved_bytes - end.torch_allocated_bytes
    return max(free - max(private - live, 0), 0)


def usage_bytes(report: RunReport, terms: FullInitTerms) -> int:
    """Usage: device memory in use at the end of init plus what serving's first full-size step adds.

    That step needs the activation headroom again, beyond what the allocator already holds
    cached for it at the final reading (``default_pool_cached``: the serving stream's free
    blocks where read; graph pools' free space serves only replays): a reading taken after ``empty_cache()`` adds the whole headroom, a reading taken
    after a full-size step adds nothing. An MLA model's step over cached context then adds its
    context chunk (``mla_context_bytes``) in segments of its own.

    Raises:
        ReportFormatError: the final reading has no device-memory figure.
    """
    end = final_reading(report)
    cached = default_pool_cached(report, end)
    transient = max(terms.profile_peak_activation_bytes - cached, 0) + terms.mla_context_bytes
    return device_used(end, report, "the final reading") + transient


def _allocated(spec: KVCacheSpec, kv_bytes: int) -> int:
    """Bytes the KV cache really takes for a budget of ``kv_bytes``: whole blocks only."""
    return kv_cache_bytes(spec, kv_bytes)


def _vllm_record(report: RunReport, requested: int, retained_non_kv: int) -> EstimateRecord:
    spec = report.kv_cache
    assert spec is not None  # measured_kv_bytes() already required it
    figures = report.vllm
    profile = report.estimate.vllm_graph_profile if report.estimate is not None else None
    cg: int | None = None
    note = "graph estimate as vLLM logged it"
    if profile is not None:
        cg = vllm_cudagraph_estimate(
            profile.measured_bytes, profile.full_samples_bytes, profile.full_graph_count
        )
        note = (
            f"requested - non-KV - graph estimate; {len(profile.full_samples_bytes)} FULL samples "
            f"extrapolated to {profile.full_graph_count} graphs"
        )
    elif figures is not None:
        cg = figures.cudagraph_estimate_bytes
    non_kv = figures.non_kv_cache_memory_bytes if figures is not None else None
    kv: int | None = None
    if non_kv is not None and cg is not None:
        kv = max(requested - non_kv - cg, 0)
    elif figures is not None and figures.available_kv_cache_bytes is not None:
        kv = max(figures.available_kv_cache_bytes, 0)
        note = "available KV bytes as vLLM returned them"
    if kv is None:
        return EstimateRecord(
            estimator="vllm",
            cudagraph_estimate_bytes=cg,
            non_kv_cache_bytes=non_kv,
            note="vLLM's figures (non-KV memory, graph estimate) are missing from the report",
        )
    allocated = _allocated(spec, kv)
    return EstimateRecord(
        estimator="vllm",
        cudagraph_estimate_bytes=cg,
        non_kv_cache_bytes=non_kv,
        kv_cache_bytes=kv,
        kv_tokens=config_kv_tokens(spec, kv, report.config),
        usage_minus_budget_bytes=retained_non_kv + allocated - requested,
        note=note,
    )


def compare(report: RunReport, *, margin_bytes: int = 0) -> EstimateComparison:
    """Put vLLM's estimate, memest's full-initialization estimate and the end state side by side.

    Usage minus budget for an estimator is the end-of-init device usage this start would have
    had with that estimator's KV cache: the measured non-KV memory plus its whole KV blocks,
    minus the budget. For the estimator that sized this start it equals the measured value.

    Usage is ``usage_bytes``: the end of init plus what serving's first full-size step adds.

    Args:
        report: one complete start (see ``full_init_terms`` for what it must hold).
        margin_bytes: safety margin memest keeps free.

    Raises:
        ReportFormatError: a phase, reading or figure is missing, or the schema version differs.
        InvariantError: the terms do not add up.
    """
    terms = full_init_terms(report, margin_bytes=margin_bytes)
    spec = report.kv_cache
    assert spec is not None
    requested = terms.requested_bytes
    usage_end = usage_bytes(report, terms)
    kv_measured = measured_kv_bytes(report)
    retained_non_kv = usage_end - kv_measured

    if margin_bytes:  # a real start fits its own budget; a margin can make it not
        require_fit(non_kv_bytes(terms), requested, field="margin", value=margin_bytes)
    memest_kv = full_init_kv_budget(terms)
    memest = EstimateRecord(
        estimator="memest",
        cudagraph_estimate_bytes=terms.graph_pool_bytes,
        non_kv_cache_bytes=non_kv_bytes(terms),
        kv_cache_bytes=memest_kv,
        kv_tokens=config_kv_tokens(spec, memest_kv, report.config),
        usage_minus_budget_bytes=retained_non_kv + _allocated(spec, memest_kv) - requested,
        note="full initialization: requested - (torch baseline + weights + activation peak + "
        "outside torch + graph pools by reservation + runner buffers + profiling residue + "
        "margin)",
    )
    measured = EstimateRecord(
        estimator="measured",
        non_kv_cache_bytes=retained_non_kv,
        kv_cache_bytes=kv_measured,
        kv_tokens=config_kv_tokens(spec, kv_measured, report.config),
        usage_minus_budget_bytes=usage_end - requested,
        note="end of initialization: device memory in use (plus the activation peak not yet "
        "cached) minus the budget",
    )
    previous = report.estimate
    return EstimateComparison(
        requested_bytes=requested,
        components=terms_components(terms),
        records=[_vllm_record(report, requested, retained_non_kv), memest, measured],
        full_init=terms,
        vllm_graph_profile=previous.vllm_graph_profile if previous is not None else None,
        startup_plan=previous.startup_plan if previous is not None else None,
    )


def record(comparison: EstimateComparison, estimator: str) -> EstimateRecord | None:
    """The comparison's record for ``estimator``, or None."""
    for rec in comparison.records:
        if rec.estimator == estimator:
            return rec
    return None

"""vLLM 0.34's growable KV cache beside memest's terms: the one definition of its margin's use.

vLLM 0.34 (``vllm/v1/worker/extensible_kv_cache.py: measure_kv_cache_bytes``) commits the KV
cache from the memory measured after capture and keeps free the larger of its measured transient
peak and torch's reservation growth, plus a margin ``max(1 GiB, 0.75 x peak)`` for what that
measurement misses. memest measures serving's transient itself (the activation headroom of the
first full-size step, plus MLA's context chunk), so it can say how much of vLLM's margin that
need takes and how much it expects to stay unused.

Before a start (the pre-flight, the what-if at G'), ``predict_growable`` gives both sizings from
the full-initialization terms: everything resident after capture is every non-KV term but the
transient ones, which both sizings keep free; vLLM adds its margin, memest its own.
"""

from __future__ import annotations

from memest.estimate.kv import kv_tokens
from memest.estimate.phases import budget_bytes, non_kv_bytes
from memest.schema import (
    ExtensibleKvSizing,
    FullInitTerms,
    GrowableKvMargin,
    KVCacheSpec,
    RunReport,
)
from memest.schema.estimate import GrowableKvPrediction
from memest.vllm_versions import VllmVersion


def transient_bytes(terms: FullInitTerms) -> int:
    """The terms a start holds only at its peak, not resident after capture: serving's activation
    headroom and MLA's context chunk (what a growable sizing must keep free)."""
    return terms.profile_peak_activation_bytes + terms.mla_context_bytes


def margin_use(sizing: ExtensibleKvSizing, terms: FullInitTerms | None) -> GrowableKvMargin:
    """vLLM's growable sizing beside memest's terms (None: memest's need unknown).

    What vLLM counted is ``max(transient peak, torch reservation growth)``, kept free beside its
    margin; memest's need beyond that comes out of the margin, and the rest of the margin is what
    memest expects serving's peak to leave unused (negative: the margin falls short).
    """
    counted = max(sizing.transient_peak_bytes, sizing.torch_reserve_growth_bytes)
    need = None if terms is None else transient_bytes(terms)
    beyond = None if need is None else max(need - counted, 0)
    return GrowableKvMargin(
        sized_by=sizing.sized_by,
        committed_kv_bytes=sizing.committed_bytes,
        vllm_transient_bytes=counted,
        vllm_margin_bytes=sizing.margin_bytes,
        memest_need_bytes=need,
        memest_need_beyond_vllm_bytes=beyond,
        margin_unused_bytes=None if beyond is None else sizing.margin_bytes - beyond,
    )


def report_margin_use(report: RunReport, terms: FullInitTerms | None) -> GrowableKvMargin | None:
    """``margin_use`` of a report whose KV cache was growable; None for any other start."""
    sizing = report.vllm.extensible_kv if report.vllm is not None else None
    return None if sizing is None else margin_use(sizing, terms)


def predict_growable(
    row: VllmVersion,
    terms: FullInitTerms,
    spec: KVCacheSpec,
    *,
    total_bytes: int,
    gpu_memory_utilization: float | None,
    margin_bytes: int = 0,
    lengths: tuple[int | None, int | None] = (None, None),
) -> GrowableKvPrediction | None:
    """Both sizings of a growable cache on ``row``'s release; None where it has none.

    ``gpu_memory_utilization``: as the start passes it (None: unset, 1.0 on 0.34).
    ``margin_bytes``: MEMEST_MARGIN_BYTES (memest's margin adds vLLM's non-torch reserve).
    ``lengths``: max_model_len and max_num_batched_tokens, which a hybrid's tokens depend on.
    """
    kv = row.extensible_kv
    if kv is None:
        return None
    util = row.gpu_memory_utilization(gpu_memory_utilization, extensible=True)
    memest_margin_bytes = kv.memest_margin_bytes(margin_bytes)
    transient = transient_bytes(terms)
    resident = non_kv_bytes(terms) - transient
    readings = {
        "init_free_memory": total_bytes,
        "free_memory": max(total_bytes - resident, 0),
        "committed_bytes": 0,
        "requested_memory": budget_bytes(total_bytes, util),
        "transient_peak_bytes": transient,
    }
    ours = kv.kv_cache_bytes(
        **readings, margin_floor_bytes=memest_margin_bytes, margin_fraction=0.0
    )
    theirs = kv.kv_cache_bytes(**readings)
    return GrowableKvPrediction(
        gpu_memory_utilization=util,
        transient_peak_bytes=transient,
        vllm_margin_bytes=kv.margin_bytes(transient),
        memest_margin_bytes=memest_margin_bytes,
        vllm_kv_bytes=theirs,
        memest_kv_bytes=ours,
        vllm_kv_tokens=kv_tokens(spec, theirs, *lengths),
        memest_kv_tokens=kv_tokens(spec, ours, *lengths),
    )

"""vLLM 0.34's growable KV cache in the pre-flight: what its sizing commits, and memest's.

0.34 commits its KV cache from the memory measured after capture (``measure_kv_cache_bytes``,
reproduced by ``memest.vllm_versions.ExtensibleKV.kv_cache_bytes``). Predicted from the
full-initialization terms: everything resident after capture is every non-KV term but the
transient ones (the profile run's activation peak and MLA's context chunk), which both sizings
keep free; vLLM adds its margin, memest its own.
"""

from __future__ import annotations

from memest.estimate.growable import transient_bytes
from memest.estimate.kv import kv_tokens
from memest.estimate.phases import budget_bytes, non_kv_bytes
from memest.schema import FullInitTerms, KVCacheSpec
from memest.schema.preflight import GrowableKvPrediction, PreflightRequest, PreflightResult
from memest.vllm_versions import VllmVersion


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


def with_release(
    result: PreflightResult, row: VllmVersion, req: PreflightRequest, total_bytes: int
) -> PreflightResult:
    """``result`` naming the release, with 0.34's growable-cache sizing beside memest's."""
    given = "gpu_memory_utilization" in req.model_fields_set
    growable = predict_growable(
        row,
        result.terms,
        result.kv_cache,
        total_bytes=total_bytes,
        gpu_memory_utilization=req.gpu_memory_utilization if given else None,
        lengths=(result.max_model_len, result.max_num_batched_tokens),
    )
    return result.model_copy(update={"vllm_version": row.version, "growable_kv": growable})

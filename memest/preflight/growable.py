"""vLLM 0.34's growable KV cache in the pre-flight: what its sizing commits, and memest's
(memest.estimate.growable.predict_growable, which the what-if uses too)."""

from __future__ import annotations

from memest.estimate.growable import predict_growable
from memest.schema.preflight import PreflightRequest, PreflightResult
from memest.vllm_versions import VllmVersion

__all__ = ["predict_growable", "with_release"]


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

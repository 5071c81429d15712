"""KV-budget estimates side by side: vLLM's own, memest's full-initialization one, and the end state."""

from __future__ import annotations

from typing import Literal

from memest.schema._base import Bytes, Field, MemestModel, NonNegativeBytes

Estimator = Literal["vllm", "memest", "memest-plan", "measured", "published"]


class EstimateRecord(MemestModel):
    estimator: Estimator
    cudagraph_estimate_bytes: Bytes | None = None
    non_kv_cache_bytes: Bytes | None = None
    kv_cache_bytes: NonNegativeBytes | None = None
    kv_tokens: int | None = Field(default=None, ge=0)
    usage_minus_budget_bytes: Bytes | None = Field(
        default=None,
        description="Device memory in use at the end of init minus utilization x total; "
        "positive = over budget",
    )
    note: str = ""


class EstimateComparison(MemestModel):
    requested_bytes: NonNegativeBytes | None = Field(
        default=None, description="gpu_memory_utilization x total device memory"
    )
    components: dict[str, Bytes] = Field(
        default_factory=dict, description="Full-initialization terms that sum to non-KV memory"
    )
    records: list[EstimateRecord] = Field(default_factory=list)

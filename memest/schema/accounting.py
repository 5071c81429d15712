"""One start's memory, computed once by ``memest.estimate.account`` and read by every surface."""

from __future__ import annotations

from typing import Literal

from memest.schema._base import Bytes, Field, MemestModel, NonNegativeBytes
from memest.schema.estimate import EstimateRecord, FullInitTerms
from memest.schema.report import KvSizedBy

#: "current": recomputed from the report's phase readings by this version of memest.
#: "stored": the report lacks those readings, so its stored figures are shown as they are,
#: measured by an older definition.
Definition = Literal["current", "stored"]

#: What "usage" holds: device memory in use at the end of init plus the reservation serving's
#: first full-size step adds ("end_of_init_plus_first_step"); for an MLA model also the chunk its
#: prefill over cached context adds ("end_of_init_plus_first_step_and_context_chunk"); or the
#: end-of-init reading alone that older reports carry ("end_of_init").
UsageKind = Literal[
    "end_of_init_plus_first_step", "end_of_init_plus_first_step_and_context_chunk", "end_of_init"
]


class KVGroupShare(MemestModel):
    """One KV-cache group's part of a hybrid's KV cache (memest.estimate.kv_groups.group_rows)."""

    kind: str = Field(description="KVCacheGroup.kind")
    num_layers: int = Field(ge=1)
    block_size: int = Field(ge=1)
    sliding_window: int | None = Field(default=None, ge=1)
    blocks_per_request: int = Field(ge=1, description="Blocks a request of max_model_len holds")
    share: float = Field(
        ge=0, le=1, description="Of the budget: the group's blocks over a request's blocks"
    )
    kv_bytes: NonNegativeBytes = Field(description="Of the allocated KV cache (by share)")
    tokens_per_request: int | None = Field(
        default=None, ge=0, description="Tokens a request keeps here; None: a state group"
    )
    tokens: int | None = Field(
        default=None, ge=0, description="tokens_per_request times max concurrency"
    )


class GrowableKvMargin(MemestModel):
    """vLLM 0.34's growable KV cache beside memest's terms: what vLLM committed, what it kept
    free for serving, and how much of its margin memest's measured need leaves unused
    (memest.estimate.growable.margin_use, the one definition)."""

    sized_by: Literal["vllm", "memest"] = Field(
        description="Whose figures sized the committed cache: vLLM's margin, or memest's (apply)"
    )
    committed_kv_bytes: NonNegativeBytes | None = Field(
        default=None, description="KV bytes extend_kv_cache committed (physically mapped)"
    )
    vllm_transient_bytes: NonNegativeBytes = Field(
        description="What vLLM counted for serving's transients: the larger of its measured "
        "transient peak and torch's reservation growth, kept free beside its margin"
    )
    vllm_margin_bytes: NonNegativeBytes = Field(
        description="vLLM's margin beyond that: max(KV_CACHE_MARGIN_FLOOR_BYTES, "
        "KV_CACHE_MARGIN_FRACTION x transient peak)"
    )
    memest_need_bytes: NonNegativeBytes | None = Field(
        default=None,
        description="memest's measured transient need: the activation headroom of serving's "
        "first full-size step plus MLA's context chunk (None: no terms, an older report)",
    )
    memest_need_beyond_vllm_bytes: NonNegativeBytes | None = Field(
        default=None, description="max(memest's need - what vLLM counted, 0): margin it takes"
    )
    margin_unused_bytes: Bytes | None = Field(
        default=None,
        description="GiB of vLLM's margin memest expects unused at serving's peak: margin - "
        "memest's need beyond what vLLM counted; negative = the margin falls short by that much",
    )


class StartAccounting(MemestModel):
    """Where one start's memory went and how much KV cache it holds, every figure defined once.

    The CLI, the service API, the dashboard and ``/metrics`` all show these fields; none of them
    recomputes a figure.
    """

    report_id: str
    definition: Definition = "current"
    definition_note: str = Field(
        default="", description="Why the figures are stored ones, when definition is 'stored'"
    )
    kv_sized_by: KvSizedBy | None = Field(
        default=None,
        description="Who sized this start's KV cache: 'vllm', 'memest' (apply mode) or "
        "'memest-plan' (a fixed KV size: a startup plan); None when the report does not say",
    )
    usage_kind: UsageKind | None = None
    budget_bytes: NonNegativeBytes | None = Field(
        default=None, description="vLLM's requested memory: ceil(gpu_memory_utilization x total)"
    )
    usage_bytes: NonNegativeBytes | None = Field(default=None, description="See usage_kind")
    usage_minus_budget_bytes: Bytes | None = Field(
        default=None, description="usage - budget; positive = over budget (OOM risk)"
    )
    kv_cache_bytes: NonNegativeBytes | None = Field(
        default=None, description="KV cache this start allocated (whole blocks, all layers)"
    )
    kv_tokens: int | None = Field(default=None, ge=0, description="KV capacity in tokens")
    kv_blocks: int | None = Field(default=None, ge=0)
    max_model_len: int | None = Field(default=None, ge=1)
    max_concurrency: float | None = Field(
        default=None, ge=0, description="Requests of max_model_len tokens the KV cache holds"
    )
    kv_groups: list[KVGroupShare] = Field(
        default_factory=list,
        description="Hybrid models: each KV-cache group's blocks, share of the budget and "
        "tokens (empty: one group)",
    )
    non_kv_bytes: Bytes | None = Field(
        default=None, description="usage - KV cache: every byte the start keeps besides the KV"
    )
    graph_pool_bytes: Bytes | None = Field(
        default=None,
        description="Reserved graph-pool growth over the real capture (a stored phase split "
        "may show a shrinking pool)",
    )
    graph_pool_by_stage_bytes: dict[str, NonNegativeBytes] = Field(default_factory=dict)
    capture_added_bytes: Bytes | None = Field(
        default=None, description="Device memory added during the real capture (all kinds)"
    )
    terms: FullInitTerms | None = Field(
        default=None, description="memest's full-initialization terms of this start"
    )
    estimators: list[EstimateRecord] = Field(
        default_factory=list,
        description="One record per estimator (vllm, memest, memest-plan, measured): the KV "
        "budget each gives and the usage minus budget this start would have had with it",
    )
    vllm_cudagraph_estimate_bytes: int | None = Field(
        default=None,
        description="vLLM's graph-memory estimate: the vllm estimator record's (vLLM's rule on "
        "the graph profile this start recorded), else as vLLM logged it",
    )
    vllm_cudagraph_logged_bytes: int | None = Field(
        default=None, description="vLLM's graph-memory estimate as vLLM logged it in this start"
    )
    vllm_cudagraph_actual_bytes: int | None = Field(
        default=None, description="vLLM's 'actual' graph memory (free-memory delta of capture)"
    )
    growable_kv: GrowableKvMargin | None = Field(
        default=None,
        description="vLLM 0.34's growable KV cache beside memest's terms, with the margin memest "
        "expects unused; None where the start's KV cache was not growable",
    )

    def estimator(self, name: str) -> EstimateRecord | None:
        """The record of estimator ``name``, or None."""
        return next((r for r in self.estimators if r.estimator == name), None)

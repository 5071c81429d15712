"""KV-budget estimates side by side: vLLM's own, memest's full-initialization one, the end state."""

from __future__ import annotations

from typing import Literal

from memest.schema._base import Bytes, Field, MemestModel, NonNegativeBytes

Estimator = Literal["vllm", "memest", "memest-plan", "measured", "published"]

#: Estimators whose ``non_kv_cache_bytes`` hold their CUDA-graph estimate (memest's terms do);
#: vLLM's non-KV figure leaves its graph estimate out and subtracts it on its own.
GRAPHS_IN_NON_KV: frozenset[str] = frozenset({"memest"})


class EstimateRecord(MemestModel):
    estimator: Estimator
    cudagraph_estimate_bytes: Bytes | None = None
    non_kv_cache_bytes: Bytes | None = Field(
        default=None,
        description="What the estimator holds back from the budget besides the KV cache, as it "
        "records it: memest's includes its CUDA-graph estimate, vLLM's leaves "
        "it out, measured is usage minus the KV cache; compare estimators by "
        "non_kv_besides_graphs_bytes()",
    )
    kv_cache_bytes: NonNegativeBytes | None = None
    kv_tokens: int | None = Field(default=None, ge=0)
    usage_minus_budget_bytes: Bytes | None = Field(
        default=None,
        description="Device memory in use at the end of init minus utilization x total; "
        "positive = over budget",
    )
    note: str = ""

    def non_kv_besides_graphs_bytes(self) -> int | None:
        """Non-KV memory besides the CUDA-graph estimate: one definition for every estimator
        (None when the record lacks a figure, and for measured/published records)."""
        non_kv, graphs = self.non_kv_cache_bytes, self.cudagraph_estimate_bytes
        if non_kv is None or self.estimator in ("measured", "published"):
            return None
        if self.estimator not in GRAPHS_IN_NON_KV:
            return non_kv
        return None if graphs is None else non_kv - graphs


class FullInitTerms(MemestModel):
    """Memory a complete initialization retains besides the KV cache, term by term.

    The KV budget is ``requested_bytes`` minus every other term (see
    ``memest.estimate.full_init_kv_budget``). Graph pools are counted by reservation per stage,
    never by free-memory deltas, so an ``empty_cache()`` inside a window cannot hide or add to
    them.
    """

    requested_bytes: NonNegativeBytes = Field(description="ceil(gpu_memory_utilization x total)")
    weights_bytes: NonNegativeBytes = Field(description="Live weight tensors after loading")
    profile_peak_activation_bytes: NonNegativeBytes = Field(
        description="Activation headroom serving's first full-size step needs: the reservation "
        "a second, warm profile pass adds from an empty cache (vLLM plugin), else the profile "
        "run's allocated peak above what it left allocated"
    )
    mla_context_bytes: NonNegativeBytes = Field(
        default=0,
        description="MLA only: what MLA's prefill up-projection reserves beyond the activation "
        "headroom, which vLLM's profile run (attention skipped) does not allocate: kv_nope, k "
        "(and v padded for FlashAttention 2) of a full step's new tokens and of one "
        "chunked-prefill workspace chunk of cached context (a prefix-cache hit), less the "
        "profile run's stand-in where the headroom holds it (memest.estimate.mla_context)",
    )
    outside_torch_bytes: NonNegativeBytes = Field(
        description="Device memory the PyTorch allocator does not hold: CUDA context, library "
        "handles, NCCL, graph objects"
    )
    graph_pool_bytes: NonNegativeBytes = Field(
        description="Reserved growth of the graph pool over all capture stages"
    )
    graph_pool_by_stage_bytes: dict[str, NonNegativeBytes] = Field(
        default_factory=dict,
        description="graph_pool_bytes split by capture stage; sums to graph_pool_bytes when given",
    )
    runner_buffer_bytes: NonNegativeBytes = Field(
        default=0,
        description="Runner buffers allocated with the KV cache, KV excluded, plus default-pool "
        "buffers allocated after it (warm-up, graph outputs) and live at the end",
    )
    profiling_residue_bytes: NonNegativeBytes = Field(
        default=0, description="Allocations that profiling left live before the KV cache"
    )
    margin_bytes: NonNegativeBytes = Field(default=0, description="Safety margin kept free")
    baseline_torch_bytes: NonNegativeBytes = Field(
        default=0,
        description="Allocator reservation before the weights (cuBLAS workspaces from the "
        "device-init matmul, NCCL buffers through the allocator)",
    )
    source: str = Field(default="", description="How the terms were obtained, e.g. report, lab")


class VllmGraphProfile(MemestModel):
    """What vLLM's ``profile_cudagraph_memory`` measured, so its estimate can be recomputed."""

    measured_bytes: Bytes = Field(
        description="Memory of the whole throwaway capture, as vLLM read it"
    )
    full_samples_bytes: list[Bytes] = Field(
        default_factory=list, description="Per-graph memory of the sampled (widest) FULL graphs"
    )
    full_graph_count: int = Field(default=0, ge=0, description="Target FULL graphs to be captured")


class StartupPlanInputs(MemestModel):
    """Values only the running vLLM worker knows, needed to write its startup-plan file."""

    fingerprint: str = Field(description="vllm.v1.worker.startup_plan.compute_plan_fingerprint")
    free_memory_baseline_bytes: NonNegativeBytes = Field(
        description="Worker.init_snapshot.free_memory"
    )


class EstimateComparison(MemestModel):
    requested_bytes: NonNegativeBytes | None = Field(
        default=None, description="gpu_memory_utilization x total device memory"
    )
    components: dict[str, Bytes] = Field(
        default_factory=dict, description="Full-initialization terms that sum to non-KV memory"
    )
    records: list[EstimateRecord] = Field(default_factory=list)
    full_init: FullInitTerms | None = None
    vllm_graph_profile: VllmGraphProfile | None = None
    startup_plan: StartupPlanInputs | None = None


# "allocator_replay": the G snapshot's pool requests, resized for G', run through
# memest.estimate.allocsim (what-if with a snapshot); "synthetic_trace": measured at G plus the
# synthetic per-graph trace of G' minus that of G (memest.estimate.whatif_synthetic: stages G did
# not capture); the others scale measured bytes.
ScalingLaw = Literal[
    "widest_full_rows_x_context",
    "sum_piecewise_tokens",
    "widest_draft_rows_x_vocab",
    "graph_count",
    "graph_count_x_layers",
    "widest_tokens",
    "constant",
    "allocator_replay",
    "synthetic_trace",
]


class OwnerPrediction(MemestModel):
    """One (stage, owner) pool growth under grid G and as predicted under grid G'."""

    stage: str
    owner: str
    law: ScalingLaw
    measured_bytes: NonNegativeBytes = Field(description="Pool growth under G")
    factor: float = Field(ge=0, description="Ratio of the law's quantity, G' over G")
    predicted_bytes: NonNegativeBytes = Field(description="Predicted pool growth under G'")
    note: str = ""


class GrowableKvPrediction(MemestModel):
    """vLLM 0.34's growable KV cache for the same start: what its own sizing commits after
    capture, and what memest's sizing (MEMEST_ESTIMATE=apply) would commit instead.

    Both keep free the predicted transient peak (the activation terms); vLLM adds its margin,
    ``max(1 GiB, 0.75 x peak)``, memest its own: the 512 MiB vLLM keeps outside PyTorch plus
    MEMEST_MARGIN_BYTES (0 unless set).
    """

    gpu_memory_utilization: float = Field(
        description="Utilization 0.34 sizes with (unset: 1.0 with the growable cache)"
    )
    transient_peak_bytes: NonNegativeBytes = Field(
        description="Predicted transient peak kept free (profile activation + MLA context)"
    )
    vllm_margin_bytes: NonNegativeBytes = Field(description="vLLM 0.34's margin beyond it")
    memest_margin_bytes: NonNegativeBytes = Field(description="memest's margin in its place")
    vllm_kv_bytes: NonNegativeBytes = Field(description="KV bytes 0.34's default sizing commits")
    memest_kv_bytes: NonNegativeBytes = Field(description="KV bytes memest's sizing commits")
    vllm_kv_tokens: int = Field(ge=0)
    memest_kv_tokens: int = Field(ge=0)
    memest_flag: str = Field(
        default="MEMEST_ENABLE=1 MEMEST_ESTIMATE=apply",
        description="What to set on the vLLM start for memest's sizing",
    )


class WhatIf(MemestModel):
    """Per-owner pool memory and the KV budget predicted for another capture grid."""

    grid_from: str = Field(description="Short description of grid G (the measured run)")
    grid_to: str = Field(description="Short description of grid G'")
    owners: list[OwnerPrediction] = Field(default_factory=list)
    by_owner_bytes: dict[str, NonNegativeBytes] = Field(
        default_factory=dict, description="Predicted pool bytes under G' per owner, all stages"
    )
    measured_by_owner_bytes: dict[str, NonNegativeBytes] = Field(default_factory=dict)
    graph_pool_bytes_from: NonNegativeBytes = 0
    graph_pool_bytes_to: NonNegativeBytes = 0
    kv_budget_bytes_from: NonNegativeBytes | None = None
    kv_budget_bytes_to: NonNegativeBytes | None = None
    kv_tokens_from: int | None = Field(default=None, ge=0)
    kv_tokens_to: int | None = Field(default=None, ge=0)
    kv_bytes_per_token_from: int | None = Field(
        default=None, ge=0, description="KV bytes per token under G (the start's KV-cache spec)"
    )
    kv_bytes_per_token_to: int | None = Field(
        default=None,
        ge=0,
        description="KV bytes per token under G' (G's layers, with an added drafter's KV layers "
        "or without a dropped drafter's)",
    )
    max_model_len_from: int | None = Field(default=None, ge=1, description="max_model_len at G")
    max_model_len_to: int | None = Field(default=None, ge=1, description="max_model_len at G'")
    concurrency_from: float | None = Field(
        default=None, ge=0, description="Requests of max_model_len the KV tokens at G hold"
    )
    concurrency_to: float | None = Field(
        default=None, ge=0, description="Requests of G''s max_model_len the KV tokens at G' hold"
    )
    terms_from: FullInitTerms | None = Field(
        default=None, description="Every full-initialization term under G (the measured run)"
    )
    terms_to: FullInitTerms | None = Field(
        default=None, description="Every full-initialization term predicted under G'"
    )
    term_laws: dict[str, str] = Field(
        default_factory=dict,
        description="For each term that moves between G and G', the law that moved it",
    )
    dominant_owner: str | None = Field(
        default=None, description="Owner whose predicted change in bytes is largest in magnitude"
    )
    dominant_change_bytes: Bytes = 0
    vllm_version_to: str | None = Field(
        default=None,
        description="The vLLM release whose rules G' is predicted with (capture sizes, KV block "
        "size, growable KV sizing)",
    )
    growable_kv_to: GrowableKvPrediction | None = Field(
        default=None,
        description="vLLM 0.34's growable KV cache at G': what its own sizing commits and what "
        "memest's would; None on a release without it",
    )
    notes: list[str] = Field(default_factory=list)

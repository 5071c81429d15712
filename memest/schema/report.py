"""RunReport: one rank's startup, as written by the vLLM plugin and stored by the service."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from memest.schema._base import Bytes, Field, MemestModel, NonNegativeBytes
from memest.schema.breakdown import Breakdown, PhaseRecord
from memest.schema.estimate import EstimateComparison
from memest.schema.plan import CapturePlan


class BuildInfo(MemestModel):
    label: str = Field(default="", description="Free label for comparisons, e.g. main or PR-123")
    vllm_version: str | None = None
    vllm_commit: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    memest_version: str | None = None


class GpuInfo(MemestModel):
    name: str
    total_bytes: NonNegativeBytes | None = None
    compute_capability: str | None = None
    driver_version: str | None = None


class KVCacheGroup(MemestModel):
    """One KV-cache group of vLLM's hybrid allocator: layers of one kind that share one block
    table; every group draws its block ids from the one pool (KVCacheSpec.num_blocks)."""

    kind: Literal["full_attention", "sliding_window", "chunked_local", "mla", "mamba"] = Field(
        description="vLLM's spec: FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, "
        "MLAAttentionSpec or MambaSpec (linear attention, gated delta net, Mamba2 state)"
    )
    num_layers: int = Field(ge=1, description="Layers whose block table this group's is")
    padding_layers: int = Field(
        default=0, ge=0, description="Empty slots vLLM pads the group with (same layers per group)"
    )
    block_size: int = Field(ge=1, description="Tokens per block (after page-size unification)")
    page_size_bytes: NonNegativeBytes = Field(
        description="Bytes of one layer's block: its unified page (padded where vLLM pads it)"
    )
    real_page_size_bytes: NonNegativeBytes | None = Field(
        default=None, description="The page's content before padding (a Mamba state, per layer)"
    )
    sliding_window: int | None = Field(default=None, ge=1)
    attention_chunk_size: int | None = Field(default=None, ge=1)
    state_blocks: int | None = Field(
        default=None,
        ge=1,
        description="Mamba groups: blocks (states) one request holds whatever its length",
    )


class KVCacheSpec(MemestModel):
    kind: str = Field(
        default="full_attention", description="full_attention, mla, sliding_window, ..."
    )
    num_layers: int = Field(ge=0)
    num_kv_heads: int = Field(default=0, ge=0)
    head_size: int = Field(default=0, ge=0)
    dtype: str = "bfloat16"
    dtype_bytes: int = Field(default=2, ge=1)
    block_size: int = Field(ge=1)
    page_size_bytes: NonNegativeBytes | None = Field(
        default=None, description="Bytes per block, all layers"
    )
    num_blocks: int | None = Field(default=None, ge=0)
    kv_tokens: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] = Field(default_factory=dict, description="MLA latent / indexer caches")
    groups: list[KVCacheGroup] = Field(
        default_factory=list,
        description="Hybrid models: vLLM's KV-cache groups (empty: one full-attention or MLA "
        "group of num_layers layers); kind is then 'hybrid'",
    )


class ModelShape(MemestModel):
    """A model's dimensions from the Hugging Face config vLLM loaded (the names are the config's).

    The what-if sizes the grid-sized runner buffers and a drafter's weights by them
    (memest.estimate.runner_buffers); a user's ``config.json`` gives the same fields.
    """

    architectures: list[str] = Field(default_factory=list)
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    dtype: str = Field(default="bfloat16", description="Weights' dtype as vLLM loads them")
    intermediate_size: int | None = Field(default=None, ge=1)
    num_hidden_layers: int | None = Field(default=None, ge=0)
    num_attention_heads: int | None = Field(default=None, ge=1)
    num_key_value_heads: int | None = Field(default=None, ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    draft_vocab_size: int | None = Field(default=None, ge=1, description="EAGLE3 drafters")
    target_hidden_size: int | None = Field(default=None, ge=1, description="EAGLE3 drafters")
    num_aux_hidden_states: int | None = Field(default=None, ge=1, description="EAGLE3 drafters")
    tie_word_embeddings: bool | None = None
    model_type: str | None = None
    max_position_embeddings: int | None = Field(
        default=None,
        ge=1,
        description="Positions the model was trained for: a max_model_len past it is refused "
        "(as vLLM refuses it)",
    )
    # Mixture of experts (Qwen3-MoE / Mixtral / DeepSeek names): the fused-MoE workspace, the
    # experts' weights
    num_experts: int | None = Field(default=None, ge=1)
    n_routed_experts: int | None = Field(default=None, ge=1)
    num_local_experts: int | None = Field(default=None, ge=1)
    num_experts_per_tok: int | None = Field(default=None, ge=1)
    moe_intermediate_size: int | None = Field(default=None, ge=1)
    n_shared_experts: int | None = Field(default=None, ge=0)
    shared_expert_intermediate_size: int | None = Field(default=None, ge=0)
    first_k_dense_replace: int | None = Field(default=None, ge=0)
    moe_layer_freq: int | None = Field(default=None, ge=1)
    decoder_sparse_step: int | None = Field(default=None, ge=1)
    mlp_only_layers: list[int] | None = None
    # Multi-head latent attention (DeepSeek-V2/V3): the KV cache's latent width
    kv_lora_rank: int | None = Field(default=None, ge=1)
    q_lora_rank: int | None = Field(default=None, ge=1)
    qk_nope_head_dim: int | None = Field(default=None, ge=1)
    qk_rope_head_dim: int | None = Field(default=None, ge=0)
    v_head_dim: int | None = Field(default=None, ge=1)
    # DeepSeek sparse attention (DeepSeek-V3.2): the key positions the indexer selects per query,
    # and the indexer's heads and head size
    index_topk: int | None = Field(default=None, ge=1)
    index_n_heads: int | None = Field(default=None, ge=1)
    index_head_dim: int | None = Field(default=None, ge=1)
    # Gated delta net (Qwen3-Next / Qwen3.5): its heads and head dims, and which layers are
    # linear attention (the prefill's per-request states, memest.estimate.linear_prefill)
    linear_num_key_heads: int | None = Field(default=None, ge=1)
    linear_num_value_heads: int | None = Field(default=None, ge=1)
    linear_key_head_dim: int | None = Field(default=None, ge=1)
    linear_value_head_dim: int | None = Field(default=None, ge=1)
    linear_conv_kernel_dim: int | None = Field(default=None, ge=1)
    full_attention_interval: int | None = Field(default=None, ge=1)
    layer_types: list[str] | None = Field(
        default=None, description="config.json's layer_types (hybrid models), as vLLM read it"
    )


class RunConfig(MemestModel):
    model: str
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    speculative_method: str | None = None
    num_speculative_tokens: int = Field(default=0, ge=0)
    cudagraph_mode: str | None = None
    cudagraph_capture_sizes: list[int] = Field(default_factory=list)
    max_cudagraph_capture_size: int | None = None
    compilation_config: dict[str, Any] = Field(default_factory=dict)
    model_runner: str | None = Field(default=None, description="v1 or v2")
    kv_cache_dtype: str | None = Field(
        default=None,
        description="vLLM's --kv-cache-dtype (auto, fp8, fp8_e4m3, ...; recorded); None when not "
        "recorded: the KV-cache spec's dtype is the start's",
    )
    quantization: str | None = Field(
        default=None,
        description="vLLM's resolved quantization method (fp8, compressed-tensors, ...; "
        "recorded); None: unquantized or not recorded",
    )
    model_dims: ModelShape | None = Field(
        default=None, description="The target model's dimensions (recorded by the plugin)"
    )
    drafter_dims: ModelShape | None = Field(
        default=None, description="The drafter's dimensions (recorded by the plugin)"
    )
    mla_prefill_backend: str | None = Field(
        default=None, description="MLA models: the prefill backend vLLM chose (recorded)"
    )
    mla_decode_backend: str | None = Field(
        default=None,
        description="MLA models: the attention (decode) backend vLLM chose (recorded: "
        "TRITON_MLA, FLASHMLA, ...); TRITON_MLA reserves its split-KV decode logits in the "
        "workspace manager, which a what-if moves with max_num_seqs and max_model_len",
    )
    gdn_prefill_backend: str | None = Field(
        default=None,
        description="Gated-delta-net models: the prefill backend vLLM chose (recorded: "
        "flashinfer, triton, ...); None: not recorded, vLLM's SM90 default (flashinfer) assumed",
    )
    mla_prefill_v_padded: bool | None = Field(
        default=None,
        description="MLA models: whether that backend pads v to the qk head dim "
        "(FlashAttention 2); None when not recorded",
    )
    mla_warm_pass_without_standin: bool | None = Field(
        default=None,
        description="MLA models: memest's warm profile pass ran without vLLM's stand-in for an "
        "up-projected context chunk, so the activation headroom holds none of it (recorded); "
        "None: the headroom includes it",
    )


#: Whose figures sized a growable KV cache: vLLM's own margin, or memest's (MEMEST_ESTIMATE=apply).
ExtensibleSizedBy = Literal["vllm", "memest"]


class ExtensibleKvSizing(MemestModel):
    """vLLM 0.34's growable KV cache (``vllm/v1/worker/extensible_kv_cache.py``): the memory it
    measured after warm-up and capture, and what it committed from it.

    ``measure_kv_cache_bytes`` gives the cache ``min(requested - non-KV used, headroom -
    margin) - max(transient peak, torch reservation growth)``; the margin is
    ``max(floor, fraction x transient peak)``, vLLM's guess for what the measurement misses.
    """

    capacity_blocks: int = Field(ge=0, description="Blocks whose address space was reserved")
    committed_blocks: int | None = Field(
        default=None, ge=0, description="Blocks extend_kv_cache committed (every rank's minimum)"
    )
    bytes_per_block: NonNegativeBytes = Field(description="Physical bytes of one block")
    committed_bytes: NonNegativeBytes | None = Field(
        default=None, description="Physically mapped KV bytes after extend_kv_cache"
    )
    init_free_bytes: NonNegativeBytes = Field(description="Device free bytes at worker start")
    free_after_warmup_bytes: NonNegativeBytes = Field(
        description="Device free bytes at the sizing (after capture, torch's cache emptied)"
    )
    committed_at_sizing_bytes: NonNegativeBytes = Field(
        description="KV bytes committed when free memory was read (part of the headroom)"
    )
    requested_bytes: NonNegativeBytes = Field(description="gpu_memory_utilization x total")
    transient_peak_bytes: NonNegativeBytes = Field(
        description="The measured transient peak vLLM kept free (reserved_headroom_bytes: the "
        "larger of the profiled activation peak and its sizing warm-up steps' allocated peak)"
    )
    torch_reserve_growth_bytes: NonNegativeBytes = Field(
        description="Largest growth of torch's reservation over a sizing step"
    )
    warmup_reserve_bytes: NonNegativeBytes | None = Field(
        default=None,
        description="What warm-up kept uncommitted: the larger of the profiled peak and "
        "KV_CACHE_WARMUP_RESERVE_FRACTION of the headroom",
    )
    margin_bytes: NonNegativeBytes = Field(
        description="vLLM's margin beyond the transient peak: max(KV_CACHE_MARGIN_FLOOR_BYTES, "
        "KV_CACHE_MARGIN_FRACTION x transient peak)"
    )
    non_torch_reserve_bytes: NonNegativeBytes = Field(
        description="KV_CACHE_NON_TORCH_RESERVE_BYTES: left free for allocations outside "
        "PyTorch (torch's caching allocator is capped below it)"
    )
    vllm_kv_bytes: NonNegativeBytes = Field(
        description="KV bytes vLLM's own sizing allows (measure_kv_cache_bytes with its margin)"
    )
    memest_transient_peak_bytes: NonNegativeBytes | None = Field(
        default=None,
        description="apply: the transient peak memest had vLLM keep free (the larger of "
        "vLLM's measured peak and memest's own)",
    )
    memest_measured_transient_bytes: NonNegativeBytes | None = Field(
        default=None,
        description="apply: what memest measured serving's steps take (the warm profile "
        "pass's headroom, the full-batch step's reserve, MLA's prefill over context)",
    )
    memest_margin_bytes: NonNegativeBytes | None = Field(
        default=None, description="apply: memest's margin (MEMEST_MARGIN_BYTES) in vLLM's place"
    )
    memest_kv_bytes: NonNegativeBytes | None = Field(
        default=None, description="apply: KV bytes the sizing allowed with memest's terms"
    )
    torch_memory_limit_bytes: NonNegativeBytes | None = Field(
        default=None, description="The cap vLLM set on torch's caching allocator"
    )
    sized_by: ExtensibleSizedBy = "vllm"


class VllmFigures(MemestModel):
    """What vLLM itself computed during this start (read from the worker)."""

    requested_memory_bytes: NonNegativeBytes | None = None
    weights_bytes: NonNegativeBytes | None = None
    non_kv_cache_memory_bytes: NonNegativeBytes | None = None
    peak_activation_bytes: NonNegativeBytes | None = None
    cudagraph_estimate_bytes: Bytes | None = None
    cudagraph_actual_bytes: Bytes | None = Field(
        default=None, description="Free-memory delta of the real capture, as vLLM logs it"
    )
    available_kv_cache_bytes: Bytes | None = None
    num_gpu_blocks: int | None = None
    extensible_kv: ExtensibleKvSizing | None = Field(
        default=None,
        description="vLLM 0.34's growable KV cache sizing; None where it was off (vLLM 0.33.0, "
        "an explicit KV size, a startup plan)",
    )


class CompiledNode(MemestModel):
    """What the FX graph said about one source node of compiled code."""

    module: str | None = Field(
        default=None, description="Innermost nn.Module path, e.g. layers.3.self_attn.qkv_proj"
    )
    file: str | None = Field(default=None, description="Innermost frame of the node's stack trace")
    line: int | None = Field(default=None, ge=0)
    function: str | None = None
    code: str | None = Field(default=None, description="Source text of that frame")
    target: str | None = Field(
        default=None,
        description="The op the node calls, e.g. vllm.unified_attention_with_output.default or "
        "torch._C._nn.linear",
    )
    inputs: list[str] = Field(
        default_factory=list,
        description="Names of the computing nodes it reads (the producer of a buffer is the "
        "listed node no other listed node reads)",
    )


class CompiledSite(MemestModel):
    """One statement of Inductor's generated code that allocates a buffer."""

    line: int = Field(ge=1, description="Line of the statement in the generated module")
    buffer: str
    kernel: str | None = Field(
        default=None, description="Kernel or op that first writes the buffer (or allocates it)"
    )
    nodes: list[str] = Field(
        default_factory=list,
        description="FX source nodes of that kernel, topologically sorted (Inductor's comment)",
    )
    aten: list[str] = Field(default_factory=list, description="Original ATen ops of the kernel")


class CompiledCall(MemestModel):
    """One statement of Inductor's generated code that calls an op without allocating its
    result there (``extern_kernels.mm(..., out=buf3)``): an allocation made at this line is the
    op's own (a library workspace, for instance)."""

    line: int = Field(ge=1)
    kernel: str


class CompiledFile(MemestModel):
    """Inductor's generated module: its allocation sites and its source nodes."""

    key: str = Field(
        description="<2 chars>/c<hash>.py: the content-addressed name, equal in every start "
        "that runs the same generated code (compiled or loaded from a cache)"
    )
    sites: list[CompiledSite] = Field(default_factory=list)
    calls: list[CompiledCall] = Field(
        default_factory=list,
        description="Op calls that write buffers allocated elsewhere (extern kernels, torch.ops); "
        "empty in maps recorded before memest kept them",
    )
    nodes: dict[str, CompiledNode] = Field(
        default_factory=dict,
        description="Source node name -> module and stack frame; empty when the graph behind "
        "this code was not seen (no compile-time record and no cached map)",
    )


class CompiledCode(MemestModel):
    """torch.compile's generated code in this start: which model code each allocation serves."""

    files: list[CompiledFile] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


#: Who sized a start's KV cache: vLLM's own estimate ("vllm"), memest's budget in apply mode
#: ("memest", MEMEST_ENABLE with MEMEST_ESTIMATE=apply), or a fixed KV size vLLM was given
#: ("memest-plan": a startup plan's --kv-cache-memory-bytes, or that flag passed by hand).
KvSizedBy = Literal["vllm", "memest", "memest-plan"]


class RunReport(MemestModel):
    schema_version: Literal["1"] = "1"
    report_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    run_id: str
    rank: int = Field(default=0, ge=0)
    world_size: int = Field(default=1, ge=1)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    source: Literal["measured", "published", "synthetic"] = "measured"
    model: str
    build: BuildInfo = Field(default_factory=BuildInfo)
    gpu: GpuInfo | None = None
    config: RunConfig
    config_fingerprint: str | None = Field(
        default=None,
        description="Hash of config (memest.identity.config_fingerprint): equal for launches of "
        "the same setup, while run_id differs per launch",
    )
    capture_plans: list[CapturePlan] = Field(default_factory=list)
    kv_cache: KVCacheSpec | None = None
    phases: list[PhaseRecord] = Field(default_factory=list)
    breakdown: Breakdown | None = None
    estimate: EstimateComparison | None = None
    vllm: VllmFigures | None = None
    compiled_code: CompiledCode | None = Field(
        default=None,
        description="Allocation sites of Inductor's generated code and the FX nodes and modules "
        "behind them: the analysis names owners of compiled allocations from it",
    )
    kv_sized_by: KvSizedBy | None = Field(
        default=None,
        description="Who sized this start's KV cache, as the plugin recorded it (None: not "
        "recorded; older reports say it in a note, which memest.estimate.account reads)",
    )
    notes: list[str] = Field(default_factory=list)
    hook_errors: list[str] = Field(
        default_factory=list, description="Hooks that failed open during this start"
    )

"""Pre-flight: the KV budget of a model never started on this GPU, predicted from its config.json
and the grid (memest.preflight); request and result as the CLI's --json and the API show them."""

from __future__ import annotations

from typing import Any

from memest.schema._base import Bytes, Field, MemestModel, NonNegativeBytes
from memest.schema.estimate import FullInitTerms, GrowableKvPrediction
from memest.schema.report import KVCacheSpec

#: Largest scheduler values memest accepts in a grid (plan, preflight, what-if): far above any
#: real deployment, small enough that every figure derived from them stays finite.
MAX_NUM_SEQS_LIMIT = 1 << 16
MAX_NUM_BATCHED_TOKENS_LIMIT = 1 << 22
MAX_MODEL_LEN_LIMIT = 1 << 24


class PreflightRequest(MemestModel):
    """A model (its config.json content) and the flags ``vllm serve`` would get."""

    model_config_json: dict[str, Any] = Field(
        alias="model_config", description="The model's config.json content (Hugging Face)"
    )
    draft_model_config: dict[str, Any] | None = Field(
        default=None,
        description="The drafter's config.json content; without it an EAGLE3 drafter is one "
        "decoder layer of the target's dimensions",
    )
    gpu: str = Field(default="h200", max_length=64, description="GPU kind of the calibration")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    disable_custom_all_reduce: bool = Field(
        default=False, description="vLLM's --disable-custom-all-reduce (TP > 1)"
    )
    environment: dict[str, str] = Field(
        default_factory=dict,
        description="NCCL_* and VLLM_ALLREDUCE_* variables the workers see, by name "
        "(memest.estimate.parallel lists those that size TP's buffers)",
    )
    max_num_seqs: int | None = Field(default=None, ge=1, le=MAX_NUM_SEQS_LIMIT)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=MAX_NUM_BATCHED_TOKENS_LIMIT)
    max_model_len: int | None = Field(default=None, ge=1, le=MAX_MODEL_LEN_LIMIT)
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Unset: the calibrated vLLM release's default (memest.vllm_versions; 0.92 "
        "on vLLM 0.33.0)",
    )
    speculative_config: dict[str, Any] | None = Field(
        default=None, description="vLLM's --speculative-config: method, num_speculative_tokens"
    )
    compilation_config: dict[str, Any] | None = Field(
        default=None, description="vLLM's --compilation-config (capture-size fields)"
    )
    dtype: str = Field(default="auto", max_length=16, description="auto, bfloat16, float16")
    kv_cache_dtype: str = Field(
        default="auto",
        max_length=16,
        description="vLLM's --kv-cache-dtype: auto (the model's dtype), bfloat16, float16, fp8, "
        "fp8_e4m3, fp8_e5m2",
    )
    quantization: str | None = Field(
        default=None,
        max_length=32,
        description="vLLM's --quantization: fp8 (needs the config's FP8 quantization_config) or "
        "the online fp8_per_tensor, fp8_per_channel, fp8_per_block; unset: the config's "
        "quantization_config, if any",
    )
    block_size: int | None = Field(
        default=None,
        ge=1,
        le=1 << 16,
        description="vLLM's --block-size; unset: the attention backend's preferred size",
    )
    attention_backend: str | None = Field(
        default=None,
        max_length=32,
        description="vLLM's --attention-backend (FLASH_ATTN, FLASHMLA, ...); unset: vLLM's first",
    )
    attention_config: dict[str, Any] | None = Field(
        default=None,
        description="vLLM's --attention-config; read: flash_attn_version (2 pads MLA's v in "
        "prefill over cached context; unset: 3, what vLLM runs on SM90)",
    )
    vllm_version: str | None = Field(
        default=None,
        max_length=32,
        description="The vLLM release to predict for (0.33.0 or 0.34.0; unset: the installed "
        "one, else the newest supported); 0.34.0 adds its growable KV cache's sizing",
    )


class VllmOvershoot(MemestModel):
    """vLLM's own KV estimate minus the exact budget over the starts whose KV cache it sized.

    Only those starts: in a start memest sized (apply mode) vLLM's record is a recomputation
    from that start's profile, not a budget vLLM allocated.
    """

    starts: int = Field(ge=1, description="Measured starts whose KV cache vLLM sized")
    min_bytes: Bytes = Field(description="Smallest overshoot (vLLM's estimate - exact budget)")
    max_bytes: Bytes = Field(description="Largest overshoot")


class PreflightTerm(MemestModel):
    """One predicted full-initialization term of one rank."""

    name: str = Field(description="The FullInitTerms field it predicts")
    bytes: NonNegativeBytes
    uncertainty_bytes: NonNegativeBytes = Field(description="Half-width of the term's range")
    law: str = Field(description="How the term is predicted")
    note: str = ""


class PreflightResult(MemestModel):
    """Every full-initialization term of one rank predicted, then the KV cache it leaves."""

    model: str = Field(description="Architecture named by the config")
    family: str = Field(description="dense, moe or mla")
    measured_family: bool = Field(
        description="Whether the calibration holds a measured start of this architecture"
    )
    gpu: str
    calibration: str = Field(description="Calibration used: GPU kind, vLLM and CUDA versions")
    tensor_parallel_size: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    max_model_len: int = Field(ge=1)
    gpu_memory_utilization: float
    speculative_method: str | None = None
    num_speculative_tokens: int = Field(default=0, ge=0)
    total_graphs: int = Field(ge=0, description="CUDA graphs the capture plan captures")
    attention_backend: str = Field(description="The attention backend the block size is from")
    block_size: int = Field(ge=1, description="KV block size in tokens (vLLM 0.33.0's rule)")
    vllm_version: str | None = Field(
        default=None, description="The vLLM release whose rules and defaults were used"
    )
    growable_kv: GrowableKvPrediction | None = Field(
        default=None,
        description="vLLM 0.34's growable KV cache: its own sizing beside memest's (None on "
        "releases without it)",
    )
    terms: FullInitTerms = Field(description="Predicted terms of one rank (sum = non-KV)")
    term_details: list[PreflightTerm] = Field(default_factory=list)
    non_kv_bytes: NonNegativeBytes
    kv_budget_bytes: NonNegativeBytes = Field(
        description="requested - every other term (memest.estimate.full_init_kv_budget)"
    )
    kv_cache_bytes: NonNegativeBytes = Field(
        description="KV cache of one rank: the budget in whole blocks"
    )
    kv_cache_flag: str = Field(
        description="vLLM's flag that gives each GPU this KV cache: --kv-cache-memory-bytes=N "
        "(memest.units.kv_cache_memory_flag of kv_cache_bytes)"
    )
    kv_cache_uncertainty_bytes: NonNegativeBytes = Field(
        description="Half-width of the KV range: the sum of the terms' uncertainties"
    )
    kv_tokens: int = Field(ge=0, description="Tokens of KV cache per rank")
    kv_tokens_low: int = Field(ge=0, description="Tokens at the low end of the range")
    kv_tokens_high: int = Field(ge=0, description="Tokens at the high end of the range")
    kv_bytes_per_token: int = Field(ge=1)
    max_concurrency: float = Field(ge=0, description="Requests of max_model_len the KV holds")
    kv_cache: KVCacheSpec = Field(description="The KV-cache spec derived from the config")
    vllm_overshoot: VllmOvershoot | None = Field(
        default=None,
        description="How far vLLM's own estimate exceeded the exact budget on the calibration's "
        "starts that vLLM sized itself, for comparison; null when those starts do not describe "
        "this model's architecture or tensor_parallel_size",
    )
    notes: list[str] = Field(default_factory=list)

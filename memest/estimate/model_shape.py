"""A model's shape from its Hugging Face ``config.json``: per-rank dimensions.

Three families are told apart by the config's fields: dense attention and MLP (Llama, Qwen,
Mistral), mixture of experts (``num_experts`` / ``n_routed_experts``) and multi-head latent
attention (``kv_lora_rank``, DeepSeek-V2/V3). Tensor parallelism splits attention heads, the MLP's
intermediate size, each expert's intermediate size and the vocabulary as vLLM 0.33.0 does; norms,
routers and MLA's down-projections are replicated.

The pre-flight (memest.preflight) and the what-if (memest.estimate.whatif) read the same shape: the
synthetic graph trace (memest.estimate.synthetic_trace) and the activation law
(memest.estimate.activation) are written in its dimensions. Parameter bytes (the pre-flight's
weights law) are memest.preflight.shape's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memest.errors import ConfigError

Family = Literal["dense", "moe", "mla"]

#: Bytes per element of the dtypes vLLM accepts for --dtype (and config.json's torch_dtype).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
#: Architectures whose attention normalizes q and k per head (vLLM 0.33.0's q_norm and k_norm,
#: head_dim weights each, replicated under TP); config.json has no field that says so.
QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")

#: vLLM 0.33.0's max_model_len when config.json names no maximum length (it warns and uses 2048).
VLLM_DEFAULT_MAX_MODEL_LEN = 2048


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None, *, minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"model_config.{key}", value, "is missing")
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"model_config.{key}", value, f"expected an integer >= {minimum}")
    return value


def _opt_int(cfg: Mapping[str, Any], key: str) -> int | None:
    return None if cfg.get(key) is None else _int(cfg, key)


def dtype_bytes(cfg: Mapping[str, Any], dtype: str = "auto") -> int:
    """Bytes per weight element: ``dtype`` unless "auto", else config.json's torch_dtype."""
    name = dtype if dtype != "auto" else cfg.get("torch_dtype", "bfloat16")
    if not isinstance(name, str) or name.lower() not in DTYPE_BYTES:
        field = "dtype" if dtype != "auto" else "model_config.torch_dtype"
        raise ConfigError(field, name, f"expected one of {sorted(DTYPE_BYTES)} or auto")
    return DTYPE_BYTES[name.lower()]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Per-rank dimensions of one model under tensor parallelism ``tp`` (sizes in elements)."""

    architecture: str
    family: Family
    tp: int
    dtype_bytes: int
    hidden: int
    num_layers: int
    vocab: int
    heads: int  # attention heads per rank
    kv_heads: int  # KV heads per rank (replicated when fewer than tp)
    head_dim: int
    intermediate: int  # dense MLP intermediate per rank
    tied: bool
    max_position: int
    experts: int = 0
    topk: int = 0
    moe_intermediate: int = 0  # one expert's intermediate per rank
    shared_intermediate: int = 0  # shared experts' intermediate per rank
    moe_layers: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    extra_input_hidden: int = 0  # EAGLE3 drafters concatenate hidden states: 2 x hidden input
    qk_norm: bool = False  # per-head q and k RMSNorm weights (QK_NORM_ARCHITECTURES)

    @property
    def qkv(self) -> int:
        """Width of the attention input projection's output per token (per rank)."""
        if self.family == "mla":
            # q_b_proj's per-head q, and the down-projection's latents: with q_lora_rank
            # vLLM's fused_qkv_a_proj writes q's latent beside kv's (layers/mla.py forward)
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim) + (
                self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim
            )
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def kv(self) -> int:
        """Width of the per-token KV written to the cache (per rank)."""
        if self.family == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.kv_heads * self.head_dim

    @property
    def mlp_widths(self) -> tuple[int, int]:
        """(gate_up width, activation width) per token of the widest MLP of a layer (per rank)."""
        width = self.intermediate if self.moe_layers < self.num_layers else 0
        if self.moe_layers:
            width = max(width, self.topk * self.moe_intermediate + self.shared_intermediate)
        return 2 * width, width


def _family(cfg: Mapping[str, Any]) -> Family:
    if cfg.get("kv_lora_rank"):
        return "mla"
    if cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts"):
        return "moe"
    return "dense"


def _split(value: int, tp: int, field: str) -> int:
    if value % tp:
        raise ConfigError(field, value, f"is not divisible by tensor_parallel_size={tp}")
    return value // tp


def _moe_layer_count(cfg: Mapping[str, Any], layers: int) -> int:
    if cfg.get("n_routed_experts"):  # DeepSeek: dense first_k_dense_replace layers, then freq
        first = cfg.get("first_k_dense_replace", 0) or 0
        freq = cfg.get("moe_layer_freq", 1) or 1
        return sum(1 for i in range(layers) if i >= first and i % freq == 0)
    step = cfg.get("decoder_sparse_step", 1) or 1
    only = set(cfg.get("mlp_only_layers") or [])
    return sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0)


def _moe_fields(cfg: Mapping[str, Any], tp: int, layers: int) -> dict[str, int]:
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
    if not experts:
        return {}
    inter = _int(cfg, "moe_intermediate_size", cfg.get("intermediate_size"))
    shared = 0
    if cfg.get("n_shared_experts"):
        shared = _int(cfg, "n_shared_experts") * inter
    elif cfg.get("shared_expert_intermediate_size"):
        shared = _int(cfg, "shared_expert_intermediate_size")
    return {
        "experts": _int(cfg, "n_routed_experts" if cfg.get("n_routed_experts") else "num_experts")
        if not cfg.get("num_local_experts")
        else _int(cfg, "num_local_experts"),
        "topk": _int(cfg, "num_experts_per_tok"),
        "moe_intermediate": _split(inter, tp, "model_config.moe_intermediate_size"),
        "shared_intermediate": _split(shared, tp, "shared experts' intermediate size"),
        "moe_layers": _moe_layer_count(cfg, layers),
    }


def _mla_fields(cfg: Mapping[str, Any]) -> dict[str, int]:
    if not cfg.get("kv_lora_rank"):
        return {}
    return {
        "kv_lora_rank": _int(cfg, "kv_lora_rank"),
        "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim"),
        "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim"),
        "v_head_dim": _int(cfg, "v_head_dim"),
        "q_lora_rank": _opt_int(cfg, "q_lora_rank") or 0,
    }


def model_shape(cfg: Mapping[str, Any], *, tp: int = 1, dtype: str = "auto") -> ModelShape:
    """Per-rank dimensions of the model ``cfg`` (a config.json object) under TP ``tp``.

    Raises:
        ConfigError: a field the shape needs is missing or not a positive integer, or a
            dimension TP splits is not divisible by ``tp``.
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError("model_config", type(cfg).__name__, "expected a JSON object")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError("tensor_parallel_size", tp, "expected an integer >= 1")
    archs = cfg.get("architectures") or [cfg.get("model_type") or "unknown"]
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    layers = _int(cfg, "num_hidden_layers")
    family = _family(cfg)
    moe = _moe_fields(cfg, tp, layers)
    dense_inter = cfg.get("intermediate_size") or 0
    return ModelShape(
        architecture=str(archs[0]),
        family=family,
        tp=tp,
        dtype_bytes=dtype_bytes(cfg, dtype),
        hidden=hidden,
        num_layers=layers,
        vocab=_int(cfg, "vocab_size"),
        heads=_split(heads, tp, "model_config.num_attention_heads"),
        kv_heads=max(kv_heads // tp, 1),
        head_dim=_int(cfg, "head_dim", hidden // heads),
        intermediate=_split(dense_inter, tp, "model_config.intermediate_size")
        if dense_inter
        else 0,
        tied=bool(cfg.get("tie_word_embeddings", False)),
        max_position=_int(cfg, "max_position_embeddings", VLLM_DEFAULT_MAX_MODEL_LEN),
        extra_input_hidden=hidden if "eagle3" in str(archs[0]).lower() else 0,
        qk_norm=str(archs[0]) in QK_NORM_ARCHITECTURES,
        **moe,
        **_mla_fields(cfg),
    )


def layer_token_bytes(s: ModelShape) -> int:
    """Bytes per token of one decoder layer's activations, as vLLM 0.33.0's compiled pieces
    request them: five hidden-wide tensors, the attention input projection and the KV written,
    the MLP's gate_up and activation (graph capture and the profile run make these requests)."""
    gate_up, act = s.mlp_widths
    return s.dtype_bytes * (5 * s.hidden + s.qkv + s.kv + gate_up + act)

"""A model's shape from its Hugging Face ``config.json``: per-rank dimensions.

Three families are told apart by the config's fields: dense attention and MLP (Llama, Qwen,
Mistral), mixture of experts (``num_experts`` / ``n_routed_experts``) and multi-head latent
attention (``kv_lora_rank``, DeepSeek-V2/V3). Tensor parallelism splits attention heads, the MLP's
intermediate size, each expert's intermediate size and the vocabulary as vLLM 0.33.0 does; norms,
routers and MLA's down-projections are replicated.

The pre-flight (memest.preflight) and the what-if (memest.estimate.whatif) read the same shape: the
synthetic graph trace (memest.estimate.synthetic_trace) and the activation law
(memest.estimate.activation) are written in its dimensions. Parameter bytes (the pre-flight's
weights law) are memest.estimate.terms.shape's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memest.errors import ConfigError
from memest.estimate.linear_prefill import GdnLayer, gdn_layer

Family = Literal["dense", "moe", "mla"]
Fp8Scheme = Literal["tensor", "channel", "block"]
#: How a method's ignore list names layers (vLLM 0.33.0): ``exact`` module paths (fp8's
#: is_layer_skipped), ``regex`` exact or ``re:``-prefixed regexes (compressed-tensors), ``modelopt``
#: exact, substring or shell wildcard (ModelOptQuantConfigBase.is_layer_excluded).
IgnoreMatch = Literal["exact", "regex", "modelopt"]

#: Bytes per element of the dtypes vLLM accepts for --dtype (and config.json's torch_dtype).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
#: Architectures whose attention normalizes q and k per head (vLLM 0.33.0's q_norm and k_norm,
#: head_dim weights each, replicated under TP); config.json has no field that says so.
#: Draft models on vLLM 0.33.0's DFlash Qwen3 backbone (qwen3_dflash.py, qwen3_dspark.py): Qwen3
#: decoder layers, an fc over the target's auxiliary hidden states, the target's vocabulary.
DFLASH_ARCHITECTURES = (
    "DFlashDraftModel",
    "MuseGlimmerAssistantModel",
    "DFlashMuseGlimmerAssistantModel",
    "Qwen3DSparkModel",
    "Qwen3OmniDSparkModel",
)
QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", *DFLASH_ARCHITECTURES)

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
class Fp8Weights:
    """How vLLM 0.33.0 holds a model's FP8 linear layers: one byte per weight and float32 scales
    (per logical shard for ``tensor``; per output row for ``channel``; per ``block`` tile of the
    fused output x input for ``block``), plus one input scale per shard when activations are
    static. Embeddings, lm_head, norms and MoE router gates stay in the model's dtype."""

    scheme: Fp8Scheme
    block: tuple[int, int] = (128, 128)
    static_input: bool = False
    ignored: tuple[str, ...] = ()  # layers kept in the model's dtype (the method's ignore list)
    match: IgnoreMatch = "exact"
    online: bool = False  # --quantization fp8_per_*: a bf16 checkpoint quantized as it loads


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
    moe_layer_ids: tuple[int, ...] = ()  # which decoder layers are MoE (moe_layers of them)
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    extra_input_hidden: int = 0  # EAGLE3 drafters concatenate hidden states: 2 x hidden input
    qk_norm: bool = False  # per-head q and k RMSNorm weights (QK_NORM_ARCHITECTURES)
    dflash_aux_layers: int = 0  # DFlash/DSpark: target hidden states the drafter's fc takes
    markov_rank: int = 0  # DSpark's Markov head: vocab x rank, twice
    # DeepSeek sparse attention (DSA, DeepseekV32ForCausalLM): the indexer of every layer
    index_n_heads: int = 0  # indexer heads (replicated: vLLM builds its linears without TP)
    index_head_dim: int = 0  # indexer head dim (its FP8 key cache: this + 4 B per 128 values)
    index_topk: int = 0  # KV positions the indexer selects per query token; 0: no indexer
    fp8: Fp8Weights | None = None  # FP8 linear layers (fp8_weights); None: the model's dtype
    gdn: GdnLayer | None = None  # a gated-delta-net layer (Qwen3-Next); None: the model has none

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (from 0) has a MoE MLP."""
        return index in self.moe_layer_ids

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
    def sparse(self) -> bool:
        """Whether the model has DSA's indexer (``index_topk`` in its config): sparse MLA."""
        return self.index_topk > 0

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


def _moe_layer_ids(cfg: Mapping[str, Any], layers: int) -> tuple[int, ...]:
    if cfg.get("n_routed_experts"):  # DeepSeek: dense first_k_dense_replace layers, then freq
        first = cfg.get("first_k_dense_replace", 0) or 0
        freq = cfg.get("moe_layer_freq", 1) or 1
        return tuple(i for i in range(layers) if i >= first and i % freq == 0)
    step = cfg.get("decoder_sparse_step", 1) or 1
    only = set(cfg.get("mlp_only_layers") or [])
    return tuple(i for i in range(layers) if i not in only and (i + 1) % step == 0)


def _moe_fields(cfg: Mapping[str, Any], tp: int, layers: int) -> dict[str, Any]:
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
        "moe_layers": len(_moe_layer_ids(cfg, layers)),
        "moe_layer_ids": _moe_layer_ids(cfg, layers),
    }


def _indexer_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """DSA's indexer (vLLM 0.33.0's DeepseekV32Indexer: index_n_heads, index_head_dim,
    index_topk); only MLA models carry one."""
    if cfg.get("index_topk") is None or not cfg.get("kv_lora_rank"):
        return {}
    return {
        "index_n_heads": _int(cfg, "index_n_heads"),
        "index_head_dim": _int(cfg, "index_head_dim"),
        "index_topk": _int(cfg, "index_topk"),
    }


def _mla_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    if not cfg.get("kv_lora_rank"):
        return {}
    return {
        "kv_lora_rank": _int(cfg, "kv_lora_rank"),
        "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim"),
        "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim"),
        "v_head_dim": _int(cfg, "v_head_dim"),
        "q_lora_rank": _opt_int(cfg, "q_lora_rank") or 0,
    }


#: vLLM 0.33.0's online FP8 shorthands (vllm/config/quantization.py _ONLINE_SHORTHANDS): an
#: unquantized checkpoint quantized at load; ``--quantization fp8`` is for FP8 checkpoints only.
ONLINE_FP8: dict[str, Fp8Scheme] = {
    "fp8_per_tensor": "tensor",
    "fp8_per_channel": "channel",
    "fp8_per_block": "block",
}
#: ModelOpt's FP8 algorithms (vLLM 0.33.0 modelopt.py resolve): per-tensor with static input
#: scales, per-channel with dynamic per-token activations, 128 x 128 blocks.
MODELOPT_FP8: dict[str, tuple[Fp8Scheme, bool]] = {
    "FP8": ("tensor", True),
    "FP8_PER_CHANNEL_PER_TOKEN": ("channel", False),
    "FP8_PB_WO": ("block", False),
}


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _fp8_method(qc: Mapping[str, Any]) -> Fp8Weights:
    """quant_method fp8 (vLLM's Fp8Config.from_config)."""
    block = qc.get("weight_block_size")
    ignored = _names(qc.get("ignored_layers")) or _names(qc.get("modules_to_not_convert"))
    if block is None:
        return Fp8Weights(
            "tensor", static_input=qc.get("activation_scheme") == "static", ignored=ignored
        )
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    ):
        raise ConfigError(
            "model_config.quantization_config.weight_block_size", block, "expected [n, k]"
        )
    return Fp8Weights("block", (block[0], block[1]), ignored=ignored)


def _compressed_tensors(qc: Mapping[str, Any]) -> Fp8Weights:
    """quant_method compressed-tensors with FP8 weights (num_bits 8, type float) in every group."""
    where = "model_config.quantization_config.config_groups"
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ConfigError(where, groups, "expected at least one quantization group")
    schemes = set()
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping) or (weights.get("num_bits"), weights.get("type")) != (
            8,
            "float",
        ):
            raise ConfigError(f"{where}.{name}.weights", weights, "memest sizes FP8 weights only")
        acts = group.get("input_activations")
        static = isinstance(acts, Mapping) and acts.get("dynamic") is False
        block = weights.get("block_structure") or [128, 128]
        schemes.add((str(weights.get("strategy")), tuple(block), static))
    if len(schemes) > 1:
        raise ConfigError(where, sorted(groups), "groups with different FP8 schemes")
    strategy, block, static = schemes.pop()
    if strategy not in ("tensor", "channel", "block"):
        raise ConfigError(f"{where}.weights.strategy", strategy, "expected tensor, channel, block")
    return Fp8Weights(
        strategy,  # type: ignore[arg-type]
        (int(block[0]), int(block[1])),
        static,
        _names(qc.get("ignore")),
        "regex",
    )


def _modelopt(qc: Mapping[str, Any]) -> Fp8Weights:
    """quant_method modelopt: quant_algo at the top or under ``quantization``."""
    nested = qc.get("quantization")
    inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else qc
    algo = inner.get("quant_algo")
    if algo not in MODELOPT_FP8:
        raise ConfigError(
            "model_config.quantization_config.quant_algo", algo, f"expected {sorted(MODELOPT_FP8)}"
        )
    scheme, static = MODELOPT_FP8[algo]
    ignored = _names(inner.get("ignore")) or _names(inner.get("exclude_modules"))
    return Fp8Weights(scheme, static_input=static, ignored=ignored, match="modelopt")


CHECKPOINT_FP8 = {
    "fp8": _fp8_method,
    "compressed-tensors": _compressed_tensors,
    "modelopt": _modelopt,
}


def fp8_weights(cfg: Mapping[str, Any], quantization: str | None = None) -> Fp8Weights | None:
    """The FP8 weights of a config.json (its quantization_config) or of ``--quantization``.

    Raises:
        ConfigError: a method memest does not size, a checkpoint that is not FP8, or
            ``--quantization fp8`` on an unquantized checkpoint (vLLM 0.33.0 refuses it).
    """
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if quantization in ONLINE_FP8 and not qc:
        return Fp8Weights(ONLINE_FP8[quantization], online=True)
    if not qc:
        if quantization is None:
            return None
        reason = (
            "vLLM 0.33.0 refuses online fp8: use fp8_per_tensor, fp8_per_channel or fp8_per_block"
            if quantization == "fp8"
            else f"not modelled; expected fp8 (an FP8 checkpoint) or {', '.join(ONLINE_FP8)}"
        )
        raise ConfigError("quantization", quantization, reason)
    if not isinstance(qc, Mapping):
        raise ConfigError("model_config.quantization_config", qc, "expected a JSON object")
    method = qc.get("quant_method")
    if quantization is not None and quantization != method:
        raise ConfigError("quantization", quantization, f"the config's quant_method is {method}")
    parse = CHECKPOINT_FP8.get(str(method))
    if parse is None:
        raise ConfigError(
            "model_config.quantization_config.quant_method",
            method,
            f"not modelled: memest sizes FP8 weights ({', '.join(CHECKPOINT_FP8)})",
        )
    return parse(qc)


def _dflash_aux_layers(cfg: Mapping[str, Any], arch: str, layers: int) -> int:
    """How many target hidden states a DFlash drafter's fc concatenates (vLLM 0.33.0's
    _get_dflash_fc_input_size: the auxiliary layer ids, else the drafter's layer count)."""
    if arch not in DFLASH_ARCHITECTURES:
        return 0
    dflash = cfg.get("dflash_config") or {}
    ids = dflash.get("target_layer_ids") if isinstance(dflash, Mapping) else None
    ids = ids or cfg.get("target_layer_ids")
    return len(ids) if isinstance(ids, list) and ids else layers


def model_shape(
    cfg: Mapping[str, Any], *, tp: int = 1, dtype: str = "auto", quantization: str | None = None
) -> ModelShape:
    """Per-rank dimensions of the model ``cfg`` (a config.json object) under TP ``tp``; FP8
    linear layers from its quantization_config or ``quantization`` (fp8_weights).

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
        dflash_aux_layers=_dflash_aux_layers(cfg, str(archs[0]), layers),
        markov_rank=_int(cfg, "markov_rank", 0, minimum=0) if "DSpark" in str(archs[0]) else 0,
        fp8=fp8_weights(cfg, quantization),
        gdn=gdn_layer(cfg, tp=tp, dtype_bytes=dtype_bytes(cfg, dtype)),
        **moe,
        **_mla_fields(cfg),
        **_indexer_fields(cfg),
    )


def layer_token_bytes(s: ModelShape) -> int:
    """Bytes per token of one decoder layer's activations, as vLLM 0.33.0's compiled pieces
    request them: five hidden-wide tensors, the attention input projection and the KV written
    (a gated-delta-net layer's projections where the model has wider ones,
    memest.estimate.linear_prefill), the MLP's gate_up and activation (graph capture and the
    profile run make these requests)."""
    gate_up, act = s.mlp_widths
    mixer = max(s.qkv + s.kv, s.gdn.token_width if s.gdn is not None else 0)
    return s.dtype_bytes * (5 * s.hidden + mixer + gate_up + act)

"""What each decoder layer caches, read from a Hugging Face ``config.json``.

vLLM 0.33.0 gives every layer the KV-cache spec of its attention or state layer; the config says
which layer is which by family-specific fields. transformers fills ``layer_types`` from each
family's own fields when config.json omits it, and vLLM reads that list, so memest follows the
same defaults (Qwen2/3, Gemma 3, gpt-oss, Qwen3-Next, Granite 4). A kind memest does not model is
refused by name: counting it as full attention would give tokens wrong by multiples.

Kinds:

- ``full_attention``: K and V per token (FullAttentionSpec)
- ``sliding_window``: K and V per token within the window (SlidingWindowSpec)
- ``mla``: multi-head latent attention's latent per token (MLAAttentionSpec; Kimi-Linear)
- ``gated_delta_net``: Qwen3-Next's linear attention, a conv and a recurrent state per request
- ``kda``: Kimi-Linear's delta attention, a conv and a recurrent state per request
- ``mamba2``: Nemotron-H's and Granite 4's Mamba2 mixer, a conv and an SSM state per request
- ``shared_kv``: a layer that reads an earlier layer's cache (Gemma 3n), no cache of its own
- ``none``: a layer without attention or state (Nemotron-H's MLP and MoE layers)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from memest.errors import ConfigError

LayerKind = Literal[
    "full_attention",
    "sliding_window",
    "mla",
    "gated_delta_net",
    "kda",
    "mamba2",
    "shared_kv",
    "none",
]
#: Kinds whose cache is a per-request state (vLLM's MambaSpec), not per token.
STATE_KINDS: tuple[LayerKind, ...] = ("gated_delta_net", "kda", "mamba2")
#: Kinds that hold no cache of their own.
NO_CACHE_KINDS: tuple[LayerKind, ...] = ("shared_kv", "none")

#: config.json's ``layer_types`` values (transformers' names) and the kind each is.
LAYER_TYPE_KINDS: dict[str, LayerKind] = {
    "full_attention": "full_attention",
    "attention": "full_attention",  # Granite 4 (GraniteMoeHybrid)
    "sliding_attention": "sliding_window",
    "linear_attention": "gated_delta_net",  # Qwen3-Next / Qwen3.5
    "mamba": "mamba2",  # Granite 4
}
#: Granite 4's ``layer_types`` name its Mamba2 mixers ``mamba``; transformers' default for the
#: family (GraniteMoeHybridConfig) is ``linear_attention``, also a Mamba2 mixer there.
GRANITE_MODEL_TYPES = ("granitemoehybrid",)
#: Nemotron-H's ``hybrid_override_pattern``: one character per decoder layer.
NEMOTRON_PATTERN: dict[str, LayerKind] = {
    "M": "mamba2",
    "*": "full_attention",
    "-": "none",
    "E": "none",
}
#: Fields that mark a layer kind memest does not model (the family's name for it).
UNMODELLED_FIELDS = {
    "attention_chunk_size": "chunked local attention (Llama 4)",
    "attn_layer_period": "Jamba's Mamba1 layers",
    "layers_block_type": "a per-layer block type list (Jamba / Zamba / Bamba)",
    "block_types": "a per-layer block type list (RecurrentGemma)",
}


def _layers(cfg: Mapping[str, Any]) -> int:
    n = cfg.get("num_hidden_layers")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError("model_config.num_hidden_layers", n, "expected an integer >= 1")
    return n


def _positive(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"model_config.{key}", value, "expected an integer >= 1")
    return value


def _from_types(cfg: Mapping[str, Any], types: Sequence[Any], n: int) -> list[LayerKind]:
    if len(types) < n:
        raise ConfigError(
            "model_config.layer_types", len(types), f"names fewer layers than num_hidden_layers={n}"
        )
    granite = cfg.get("model_type") in GRANITE_MODEL_TYPES
    out: list[LayerKind] = []
    for name in types[:n]:
        if granite and name == "linear_attention":
            out.append("mamba2")
        elif isinstance(name, str) and name in LAYER_TYPE_KINDS:
            out.append(LAYER_TYPE_KINDS[name])
        else:
            raise ConfigError(
                "model_config.layer_types",
                name,
                f"a layer kind memest does not model (known: {', '.join(LAYER_TYPE_KINDS)})",
            )
    return out


def _default_types(cfg: Mapping[str, Any], n: int) -> list[str] | None:
    """transformers' ``layer_types`` default for the families whose config fills it."""
    model_type = cfg.get("model_type")
    if model_type in ("gemma3", "gemma3_text"):
        pattern = _positive(cfg, "sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if model_type == "gpt_oss":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        interval = _positive(cfg, "full_attention_interval", 4)
        return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    if model_type in GRANITE_MODEL_TYPES:
        return ["mamba"] * n
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not cfg.get("use_sliding_window"):
            return ["full_attention"] * n
        first = _positive(cfg, "max_window_layers", n)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return None


def _kimi(cfg: Mapping[str, Any], n: int) -> list[LayerKind]:
    """Kimi-Linear: ``linear_attn_config.kda_layers`` (counted from 1) are KDA, the rest MLA."""
    lin = cfg["linear_attn_config"]
    kda = lin.get("kda_layers") if isinstance(lin, Mapping) else None
    if not isinstance(kda, list) or not all(isinstance(i, int) for i in kda):
        raise ConfigError("model_config.linear_attn_config.kda_layers", kda, "expected a list")
    return ["kda" if i + 1 in kda else "mla" for i in range(n)]


def _nemotron(cfg: Mapping[str, Any]) -> list[LayerKind]:
    pattern = cfg["hybrid_override_pattern"]
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("model_config.hybrid_override_pattern", pattern, "expected a string")
    bad = sorted(set(pattern) - set(NEMOTRON_PATTERN))
    if bad:
        raise ConfigError(
            "model_config.hybrid_override_pattern",
            bad[0],
            f"a layer kind memest does not model (known: {' '.join(NEMOTRON_PATTERN)})",
        )
    return [NEMOTRON_PATTERN[c] for c in pattern]


def _shared_kv(cfg: Mapping[str, Any], kinds: list[LayerKind]) -> list[LayerKind]:
    """Gemma 3n: the last ``num_kv_shared_layers`` layers read earlier layers' caches."""
    shared = cfg.get("num_kv_shared_layers") or 0
    if not isinstance(shared, int) or isinstance(shared, bool) or not 0 <= shared < len(kinds):
        raise ConfigError(
            "model_config.num_kv_shared_layers", shared, "expected 0 <= it < num_hidden_layers"
        )
    return kinds[: len(kinds) - shared] + ["shared_kv"] * shared


def layer_kinds(cfg: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """Each decoder layer's cache kind, in layer order.

    Raises:
        ConfigError: a layer kind memest does not model, named with its field.
    """
    for key, what in UNMODELLED_FIELDS.items():
        if cfg.get(key) is not None:
            raise ConfigError(f"model_config.{key}", cfg[key], f"{what}: not modelled by memest")
    if "hybrid_override_pattern" in cfg:
        return tuple(_nemotron(cfg))
    n = _layers(cfg)
    if cfg.get("linear_attn_config") is not None:
        return tuple(_shared_kv(cfg, _kimi(cfg, n)))
    types = cfg.get("layer_types")
    if types is None:
        types = _default_types(cfg, n)
    if types is not None:
        if not isinstance(types, list):
            raise ConfigError("model_config.layer_types", types, "expected a list")
        return tuple(_shared_kv(cfg, _from_types(cfg, types, n)))
    # No per-layer list: vLLM's CacheConfig.sliding_window (the config's sliding_window) applies
    # to every attention layer (Mistral-class models).
    kind: LayerKind = "sliding_window" if cfg.get("sliding_window") else "full_attention"
    return tuple(_shared_kv(cfg, [kind] * n))


def sliding_window(cfg: Mapping[str, Any]) -> int:
    """The window of the config's sliding-window layers (one per model in vLLM 0.33.0)."""
    return _positive(cfg, "sliding_window", 1)


def is_hybrid(kinds: Sequence[LayerKind]) -> bool:
    """Whether vLLM's KV cache for these layers is anything but one full-attention group."""
    cached = {k for k in kinds if k not in NO_CACHE_KINDS}
    return bool(cached - {"full_attention"}) and cached != {"mla"}

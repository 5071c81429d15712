"""Terms a hybrid model's own layers bring, from vLLM 0.33.0's model code.

Weights (the pre-flight's weights law): where a hybrid architecture's parameters or buffers differ
from what the shape law (memest.estimate.terms.shape.parameter_bytes) counts for a dense model,
its bytes come from here, derived from the architecture's vLLM model class:

====================  ===========================================================================
architecture          what differs from the dense law (vLLM 0.33.0 source)
====================  ===========================================================================
Gemma3ForCausalLM     lm_head tied unless tie_word_embeddings is false (Gemma3TextConfig's default);
                      four RMSNorms per layer plus q_norm and k_norm (gemma3.py Gemma3DecoderLayer,
                      Gemma3Attention); one rotary cos/sin cache per distinct rope_parameters of the
                      layer types present (get_rope shares identical ones), each max_position x
                      factor rows (linear scaling, linear_scaling_rope.py) x head_dim in the dtype
Qwen3NextForCausalLM  gated-delta-net layers (mamba/gdn/qwen_gdn_linear_attn.py): in_proj_qkvz
                      (2 key + 2 value dims), in_proj_ba (2 value heads), conv1d (2 key + value
                      dims x kernel), dt_bias, A_log (float32), a one-head RMSNormGated, out_proj;
                      gated attention layers (qkv_proj with the output gate's second q, q/k
                      norms); MoE layers (decoder_sparse_step, mlp_only_layers) with a shared
                      expert and its one-output gate; the rotary cache at partial_rotary_factor
                      x head_dim
NemotronHForCausalLM  hybrid_override_pattern: Mamba2 mixers (mamba_mixer2.py: in_proj of z, x,
                      B, C and dt; conv1d with its bias; A in float32, D, dt_bias; a gated
                      RMSNorm; out_proj), relu2 MLPs without a gate, attention without rotary;
                      one norm per layer
GraniteMoeHybrid-     layer_types of Mamba2 mixers (as Nemotron-H's, mamba_* fields) and
ForCausalLM           attention (rotary only with position_embedding_type rope); every layer's
                      MoE (router gate, w13, w2) and shared MLP; lm_head tied only when asked
====================  ===========================================================================

Architectures not in the table keep the shape law.

Block tables (the runner-buffer term): Model Runner V2 allocates one block table per KV-cache group
(memest.estimate.runner_buffers.GroupTable).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memest.errors import ConfigError
from memest.estimate.layer_kinds import layer_kinds
from memest.estimate.linear_attention import mamba2_groups
from memest.estimate.model_shape import ModelShape
from memest.estimate.terms.shape import padded_vocab, parameter_bytes

_FLOAT32 = 4
#: vLLM 0.33.0's LinearScalingRotaryEmbedding: its cache holds max_position x factor rows.
_LINEAR_ROPE = "linear"


def _gemma3_rope_rows(cfg: Mapping[str, Any], max_position: int) -> int:
    """Rows of Gemma 3's rotary caches: one per distinct rope of the layer types present.

    Gemma3TextConfig's rope_parameters: sliding layers take rope_local_base_freq with default
    rope, full layers rope_theta with the config's rope_scaling (transformers builds them so)."""
    kinds = set(layer_kinds(cfg))
    scaling = cfg.get("rope_scaling") or {}
    ropes: set[tuple[Any, ...]] = set()
    if "sliding_window" in kinds:
        ropes.add((cfg.get("rope_local_base_freq", 10_000.0), "default", 1.0))
    if "full_attention" in kinds:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        factor = float(scaling.get("factor", 1.0)) if kind == _LINEAR_ROPE else 1.0
        ropes.add((cfg.get("rope_theta", 1_000_000.0), kind, factor))
    return sum(int(max_position * factor) for _, _, factor in ropes)


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"model_config.{key}", value, "expected an integer >= 0")
    return value


def _gemma3_bytes(cfg: Mapping[str, Any], s: ModelShape) -> int:
    tied = bool(cfg.get("tie_word_embeddings", True))
    # the dense law without its one rotary cache (Gemma 3's are counted below) and with q/k norms
    dense = parameter_bytes(dataclasses.replace(s, tied=tied, qk_norm=True, max_position=0))
    norms = 2 * s.hidden * s.num_layers  # pre/post-feedforward norms beside the dense law's two
    rope = _gemma3_rope_rows(cfg, s.max_position) * s.head_dim
    return dense + (norms + rope) * s.dtype_bytes


def _qwen3_next_bytes(cfg: Mapping[str, Any], s: ModelShape) -> int:
    """Qwen3-Next (qwen3_next.py, mamba/gdn/qwen_gdn_linear_attn.py), one rank of TP ``s.tp``."""
    tp, h, e = s.tp, s.hidden, s.dtype_bytes
    kinds = layer_kinds(cfg)
    kh, vh = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads")
    vd = _int(cfg, "linear_value_head_dim")
    key, value = kh * _int(cfg, "linear_key_head_dim"), vh * vd
    gdn = (
        h * (2 * key + 2 * value) // tp  # in_proj_qkvz
        + h * 2 * vh // tp  # in_proj_ba (Qwen3-Next's interleaved layout: TP-split)
        + (2 * key + value) // tp * _int(cfg, "linear_conv_kernel_dim")  # conv1d
        + vh // tp  # dt_bias
        + vd  # norm (RMSNormGated over one head)
        + value // tp * h  # out_proj
    ) * e + vh // tp * _FLOAT32  # A_log, float32
    heads, hd = s.heads, s.head_dim  # the shape's heads are per rank already
    gate = int(cfg.get("attn_output_gate", True))
    attention = (
        h * (heads * (1 + gate) + 2 * s.kv_heads) * hd  # qkv_proj with its output gate
        + heads * hd * h  # o_proj
        + 2 * hd  # q_norm, k_norm
    ) * e
    experts, inter = _int(cfg, "num_experts"), _int(cfg, "moe_intermediate_size")
    shared = _int(cfg, "shared_expert_intermediate_size", 0)
    moe = (
        experts * 3 * inter // tp * h  # routed experts' w13 and w2
        + 3 * shared // tp * h  # shared expert
        + h * experts  # router gate
        + h  # shared_expert_gate
    ) * e
    mlp = 3 * _int(cfg, "intermediate_size", 0) // tp * h * e  # a dense layer's gate_up, down
    step = _int(cfg, "decoder_sparse_step", 1) or 1
    dense = set(cfg.get("mlp_only_layers") or ())
    layers = sum(
        (gdn if k == "gated_delta_net" else attention)
        + (moe if i not in dense and experts > 0 and (i + 1) % step == 0 else mlp)
        + 2 * h * e  # input and post-attention norms
        for i, k in enumerate(kinds)
    )
    vocab = padded_vocab(s) * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    rotary = int(hd * float(cfg.get("partial_rotary_factor", 1.0)))
    return layers + (vocab + h + s.max_position * rotary) * e


def _nemotron_h_bytes(cfg: Mapping[str, Any], s: ModelShape) -> int:
    """Nemotron-H (nemotron_h.py, mamba/mamba_mixer2.py), one rank of TP ``s.tp``: one character
    of hybrid_override_pattern per layer, M a Mamba2 mixer, - a relu2 MLP, * attention."""
    tp, h, e = s.tp, s.hidden, s.dtype_bytes
    heads = _int(cfg, "mamba_num_heads")
    mamba = _mamba2_bytes(
        s,
        heads=heads,
        inter=heads * _int(cfg, "mamba_head_dim"),
        groups=_int(cfg, "n_groups"),
        state=_int(cfg, "ssm_state_size"),
        kernel=_int(cfg, "conv_kernel"),
        conv_bias=bool(cfg.get("use_conv_bias", True)),
        proj_bias=bool(cfg.get("use_bias", False)),
    )
    mlp = 2 * h * _int(cfg, "intermediate_size") // tp * e  # up_proj, down_proj (relu2)
    attention = (h * (s.heads + 2 * s.kv_heads) * s.head_dim + s.heads * s.head_dim * h) * e
    per = {"M": mamba, "-": mlp, "*": attention}
    pattern = str(cfg.get("hybrid_override_pattern", ""))
    unknown = sorted(set(pattern) - set(per))
    if unknown:
        raise ConfigError(
            "model_config.hybrid_override_pattern", pattern, f"layer kind {unknown[0]!r} unknown"
        )
    vocab = padded_vocab(s) * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return sum(per[c] + h * e for c in pattern) + (vocab + h) * e  # a norm per layer, norm_f


def _mamba2_bytes(
    s: ModelShape,
    *,
    heads: int,
    inter: int,
    groups: int,
    state: int,
    kernel: int,
    conv_bias: bool,
    proj_bias: bool,
) -> int:
    """One rank's MambaMixer2 (mamba/mamba_mixer2.py)."""
    tp, h, e = s.tp, s.hidden, s.dtype_bytes
    conv = inter + 2 * mamba2_groups(groups, tp) * state
    proj = (inter + conv + heads) // tp  # in_proj: z, x, B, C, dt
    return (
        h * proj
        + conv // tp * (kernel + conv_bias)  # conv1d (its conv_weights buffer is a view)
        + 2 * heads // tp  # D, dt_bias
        + inter // tp  # the gated RMSNorm
        + inter // tp * h  # out_proj
        + (proj + h if proj_bias else 0)  # in_proj's and out_proj's biases
    ) * e + heads // tp * _FLOAT32  # A, float32


def _granite4_bytes(cfg: Mapping[str, Any], s: ModelShape) -> int:
    """Granite 4 (granitemoehybrid.py), one rank of TP ``s.tp``: layer_types of mamba and
    attention layers, each with the MoE block and the shared MLP."""
    tp, h, e = s.tp, s.hidden, s.dtype_bytes
    mamba = _mamba2_bytes(
        s,
        heads=_int(cfg, "mamba_n_heads"),
        inter=_int(cfg, "mamba_expand", 2) * h,
        groups=_int(cfg, "mamba_n_groups"),
        state=_int(cfg, "mamba_d_state"),
        kernel=_int(cfg, "mamba_d_conv"),
        conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        proj_bias=bool(cfg.get("mamba_proj_bias", False)),
    )
    q, kv, hd = s.heads, s.kv_heads, s.head_dim
    attention = h * (q + 2 * kv) * hd + q * hd * h
    if cfg.get("attention_bias", False):
        attention += (q + 2 * kv) * hd + h
    attention *= e
    experts, inter = _int(cfg, "num_local_experts", 0), _int(cfg, "intermediate_size")
    shared = _int(cfg, "shared_intermediate_size", 0)
    ffn = (experts * (3 * inter // tp * h + h) + 3 * shared // tp * h + 2 * h) * e  # + 2 norms
    kinds = layer_kinds(cfg)
    rope = cfg.get("position_embedding_type") == "rope" and "full_attention" in kinds
    vocab = padded_vocab(s) * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    layers = sum((mamba if k == "mamba2" else attention) + ffn for k in kinds)
    return layers + (vocab + h + (s.max_position * hd if rope else 0)) * e


_WEIGHTS = {
    "GraniteMoeHybridForCausalLM": _granite4_bytes,
    "Gemma3ForCausalLM": _gemma3_bytes,
    "Qwen3NextForCausalLM": _qwen3_next_bytes,
    "NemotronHForCausalLM": _nemotron_h_bytes,
}


def weight_bytes(cfg: Mapping[str, Any] | None, s: ModelShape) -> int | None:
    """One rank's parameter and buffer bytes of a hybrid architecture (None: the shape law's).

    ``cfg`` is the model's config.json (its text part where it has one)."""
    if cfg is None:
        return None
    text = cfg.get("text_config")
    law = _WEIGHTS.get(s.architecture)
    if law is None:
        return None
    return law(text if isinstance(text, Mapping) else cfg, s)


def uses_hybrid_weights(architecture: str) -> bool:
    return architecture in _WEIGHTS

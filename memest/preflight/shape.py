"""Parameter bytes of a model's shape (the pre-flight's weights law).

The shape itself (``ModelShape``, ``model_shape``) is memest.estimate.model_shape's: the what-if
reads it too. It is re-exported here for the pre-flight's callers.
"""

from __future__ import annotations

import math

from memest.estimate.model_shape import (
    DTYPE_BYTES,
    QK_NORM_ARCHITECTURES,
    Family,
    ModelShape,
    dtype_bytes,
    layer_token_bytes,
    model_shape,
)

__all__ = [
    "DTYPE_BYTES",
    "QK_NORM_ARCHITECTURES",
    "VOCAB_PAD",
    "Family",
    "ModelShape",
    "dtype_bytes",
    "layer_token_bytes",
    "model_shape",
    "padded_vocab",
    "parameter_bytes",
]

#: vLLM pads the vocabulary of embeddings and lm_head to a multiple of this (times TP).
VOCAB_PAD = 64


def padded_vocab(shape: ModelShape) -> int:
    """Vocabulary rows per rank: padded to VOCAB_PAD x TP, then split."""
    step = VOCAB_PAD * shape.tp
    return math.ceil(shape.vocab / step) * step // shape.tp


#: A linear layer of one rank: (its logical output shards, its input width), in elements.
Linear = tuple[tuple[int, ...], int]
SCALE_BYTES = 4  # float32 scales (vLLM 0.33.0's create_fp8_scale_parameter)


def _attention_linears(s: ModelShape) -> list[Linear]:
    h = s.hidden
    if s.family == "mla":
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        kv_a = s.kv_lora_rank + s.qk_rope_head_dim
        rows: list[Linear] = (
            [((s.q_lora_rank, kv_a), h), ((s.heads * qk,), s.q_lora_rank)]  # fused_qkv_a, q_b
            if s.q_lora_rank
            else [((s.heads * qk,), h), ((kv_a,), h)]
        )
        kv_b = ((s.heads * (s.qk_nope_head_dim + s.v_head_dim),), s.kv_lora_rank)
        return [*rows, kv_b, ((h,), s.heads * s.v_head_dim)]
    q_in = h + s.extra_input_hidden
    kv = s.kv_heads * s.head_dim
    return [((s.heads * s.head_dim, kv, kv), q_in), ((h,), s.heads * s.head_dim)]


def _mlp_linears(s: ModelShape, moe_layer: bool) -> list[Linear]:
    """The MLP's linear layers (a MoE layer: each expert's and the shared experts'; the router
    gate is not a quantized layer in vLLM 0.33.0's MoE models and is counted apart)."""
    h = s.hidden
    if not moe_layer:
        return [((s.intermediate, s.intermediate), h), ((h,), s.intermediate)]
    expert = [((s.moe_intermediate, s.moe_intermediate), h), ((h,), s.moe_intermediate)]
    shared = s.shared_intermediate
    return expert * s.experts + ([((shared, shared), h), ((h,), shared)] if shared else [])


def _norm_params(s: ModelShape) -> int:
    """Per-layer elements outside linear layers: two RMSNorms, q/k norms, MLA's latent norms."""
    extra = 2 * s.head_dim if s.qk_norm else 0
    if s.family == "mla":
        extra += s.q_lora_rank + s.kv_lora_rank
    return 2 * s.hidden + extra


def _linear_bytes(s: ModelShape, linears: list[Linear]) -> int:
    """Bytes of linear layers: the model's dtype, or FP8 weights with their scale tensors."""
    fp8 = s.fp8
    if fp8 is None:
        return sum(sum(n) * k for n, k in linears) * s.dtype_bytes
    total = 0
    for shards, k in linears:
        n = sum(shards)
        if fp8.scheme == "tensor":
            scales = len(shards)
        elif fp8.scheme == "channel":
            scales = n
        else:
            scales = math.ceil(n / fp8.block[0]) * math.ceil(k / fp8.block[1])
        scales += len(shards) if fp8.static_input else 0
        total += n * k + scales * SCALE_BYTES
    return total


def parameter_bytes(s: ModelShape) -> int:
    """Bytes of one rank's weights: embeddings, layers, norms, lm_head (once when tied), the
    rotary cos/sin cache, and an EAGLE3 drafter's fc (3 x hidden -> hidden). FP8 models
    (``s.fp8``): linear layers at one byte per weight plus scales; the rest in the model's
    dtype."""
    h = s.hidden
    vocab = padded_vocab(s)
    dense_layers = s.num_layers - s.moe_layers
    linears = _attention_linears(s) * s.num_layers
    linears += _mlp_linears(s, True) * s.moe_layers + _mlp_linears(s, False) * dense_layers
    elems = s.num_layers * _norm_params(s) + h  # final norm
    elems += s.moe_layers * h * s.experts  # router gates
    if s.extra_input_hidden:  # EAGLE3: embeddings and lm_head are the target's; fc and norms
        linears.append(((h,), 3 * h))
        elems += 2 * h
    else:
        elems += vocab * h * (1 if s.tied else 2)
    rope_dim = s.qk_rope_head_dim if s.family == "mla" else s.head_dim
    elems += s.max_position * rope_dim
    return elems * s.dtype_bytes + _linear_bytes(s, linears)

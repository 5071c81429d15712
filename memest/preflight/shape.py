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


def _attention_params(s: ModelShape) -> int:
    h = s.hidden
    if s.family == "mla":
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        q = (
            h * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * s.heads * qk
            if s.q_lora_rank
            else h * s.heads * qk
        )
        kv_a = h * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank
        kv_b = s.kv_lora_rank * s.heads * (s.qk_nope_head_dim + s.v_head_dim)
        return q + kv_a + kv_b + s.heads * s.v_head_dim * h
    q_in = h + s.extra_input_hidden
    qkv = q_in * (s.heads + 2 * s.kv_heads) * s.head_dim
    return qkv + s.heads * s.head_dim * h + (2 * s.head_dim if s.qk_norm else 0)


def _mlp_params(s: ModelShape, moe_layer: bool) -> int:
    h = s.hidden
    if not moe_layer:
        return 3 * h * s.intermediate
    return h * s.experts + s.experts * 3 * h * s.moe_intermediate + 3 * h * s.shared_intermediate


def parameter_bytes(s: ModelShape) -> int:
    """Bytes of one rank's weights: embeddings, layers, norms, lm_head (once when tied), the
    rotary cos/sin cache, and an EAGLE3 drafter's fc (3 x hidden -> hidden)."""
    h = s.hidden
    vocab = padded_vocab(s)
    per_layer = _attention_params(s) + 2 * h
    elems = s.num_layers * per_layer + h  # final norm
    elems += s.moe_layers * _mlp_params(s, True) + (s.num_layers - s.moe_layers) * _mlp_params(
        s, False
    )
    if s.extra_input_hidden:  # EAGLE3: embeddings and lm_head are the target's; fc and norms
        elems += 3 * h * h + 2 * h
    else:
        elems += vocab * h * (1 if s.tied else 2)
    rope_dim = s.qk_rope_head_dim if s.family == "mla" else s.head_dim
    elems += s.max_position * rope_dim
    return elems * s.dtype_bytes

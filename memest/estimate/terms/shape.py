"""Parameter bytes of a model's shape (the pre-flight's weights law).

The shape itself (``ModelShape``, ``model_shape``) is memest.estimate.model_shape's: the what-if
reads it too. It is re-exported here for the pre-flight's callers.
"""

from __future__ import annotations

import math
import re
from fnmatch import fnmatch
from typing import NamedTuple

from memest.estimate.model_shape import (
    DTYPE_BYTES,
    QK_NORM_ARCHITECTURES,
    Family,
    Fp8Weights,
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

#: vLLM pads the vocabulary of embeddings and lm_head to a multiple of this.
VOCAB_PAD = 64


def padded_vocab(shape: ModelShape) -> int:
    """Vocabulary rows per rank: padded to VOCAB_PAD, then split evenly over TP (vLLM 0.33.0's
    VocabParallelEmbedding: pad_vocab_size, then divide(num_embeddings_padded, tp_size))."""
    return math.ceil(shape.vocab / VOCAB_PAD) * VOCAB_PAD // shape.tp


class Linear(NamedTuple):
    """A linear layer of one rank, as vLLM 0.33.0's model classes name it under a decoder layer."""

    name: str  # module path under ``model.layers.<i>``
    shards: tuple[int, ...]  # logical output shards, in elements
    k: int  # input width, in elements
    parts: tuple[str, ...] = ()  # the checkpoint's names of a fused layer's shards
    copies: int = 1  # routed experts: one fused layer holding ``copies`` experts


SCALE_BYTES = 4  # float32 scales (vLLM 0.33.0's create_fp8_scale_parameter)
#: MoE models whose router gate takes the quantization config (vLLM 0.33.0's GateLinear is given
#: quant_config in qwen3_moe.py; DeepSeek, Mixtral and Qwen2-MoE build it unquantized).
QUANTIZED_ROUTER_ARCHITECTURES = ("Qwen3MoeForCausalLM",)
#: Scalar q/k/v/prob scales in the model's dtype that each attention layer of an FP8 checkpoint
#: holds (vLLM 0.33.0's BaseKVCacheMethod.create_weights; fp8 and compressed-tensors give it to
#: Attention only, not MLAAttention; modelopt to both; online quantization to neither).
ATTENTION_SCALES = 4
#: compressed-tensors' attention layers instead: float32 q/k/v scales and q/k/v zero points in
#: the model's dtype, one element each (its KV-cache method's create_weights).
CT_ATTENTION_SCALES = 3


def _attention_scale_bytes(s: ModelShape) -> int:
    """Bytes of the scalar scales each attention layer of an FP8 model holds, all layers."""
    fp8 = s.fp8
    if fp8 is None or fp8.online or (s.family == "mla" and fp8.match != "modelopt"):
        return 0
    if fp8.match == "regex":  # compressed-tensors
        per_layer = CT_ATTENTION_SCALES * (SCALE_BYTES + s.dtype_bytes)
    else:
        per_layer = ATTENTION_SCALES * s.dtype_bytes
    return s.num_layers * per_layer


def _attention_linears(s: ModelShape) -> list[Linear]:
    h = s.hidden
    if s.family == "mla":
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        kv_a = s.kv_lora_rank + s.qk_rope_head_dim
        rows = (
            [
                Linear(
                    "self_attn.fused_qkv_a_proj",
                    (s.q_lora_rank, kv_a),
                    h,
                    ("q_a_proj", "kv_a_proj_with_mqa"),
                ),
                Linear("self_attn.q_b_proj", (s.heads * qk,), s.q_lora_rank),
            ]
            if s.q_lora_rank
            else [
                Linear("self_attn.q_proj", (s.heads * qk,), h),
                Linear("self_attn.kv_a_proj_with_mqa", (kv_a,), h),
            ]
        )
        kv_b = Linear(
            "self_attn.kv_b_proj", (s.heads * (s.qk_nope_head_dim + s.v_head_dim),), s.kv_lora_rank
        )
        if s.sparse:  # DSA's indexer query projection (ReplicatedLinear, the model's quant_config)
            rows.append(
                Linear(
                    "self_attn.indexer.wq_b", (s.index_n_heads * s.index_head_dim,), s.q_lora_rank
                )
            )
        return [*rows, kv_b, Linear("self_attn.o_proj", (h,), s.heads * s.v_head_dim)]
    kv = s.kv_heads * s.head_dim
    return [
        Linear(
            "self_attn.qkv_proj",
            (s.heads * s.head_dim, kv, kv),
            h + s.extra_input_hidden,
            ("q_proj", "k_proj", "v_proj"),
        ),
        Linear("self_attn.o_proj", (h,), s.heads * s.head_dim),
    ]


def _mlp(prefix: str, inter: int, h: int) -> list[Linear]:
    return [
        Linear(f"{prefix}.gate_up_proj", (inter, inter), h, ("gate_proj", "up_proj")),
        Linear(f"{prefix}.down_proj", (h,), inter),
    ]


def _mlp_linears(s: ModelShape, moe_layer: bool) -> list[Linear]:
    """The MLP's linear layers (a MoE layer: the routed experts, the shared experts, and the
    router gate when the model class quantizes it; otherwise the gate is counted apart)."""
    h = s.hidden
    if not moe_layer:
        return _mlp("mlp", s.intermediate, h)
    inter = s.moe_intermediate
    experts = [
        Linear("mlp.experts", (inter, inter), h, copies=s.experts),
        Linear("mlp.experts", (h,), inter, copies=s.experts),
    ]
    if s.architecture in QUANTIZED_ROUTER_ARCHITECTURES:
        experts.append(Linear("mlp.gate", (s.experts,), h))
    if s.shared_intermediate:
        experts += _mlp("mlp.shared_experts", s.shared_intermediate, h)
    return experts


def _router_gate_elems(s: ModelShape) -> int:
    """Router gate elements per MoE layer held in the model's dtype (outside _mlp_linears)."""
    return 0 if s.architecture in QUANTIZED_ROUTER_ARCHITECTURES else s.hidden * s.experts


def _matches(fp8: Fp8Weights, name: str, entry: str) -> bool:
    if name == entry:
        return True
    if fp8.match == "regex":
        return entry.startswith("re:") and re.match(entry[3:], name) is not None
    if fp8.match == "modelopt":
        return entry in name or fnmatch(name, entry)
    return False


def _ignored(fp8: Fp8Weights, prefix: str, linear: Linear) -> bool:
    """Whether vLLM 0.33.0 keeps this layer unquantized: its name, or every one of a fused
    layer's shard names, is on the ignore list (vLLM refuses a fused layer ignored in part).
    Routed experts under fp8's exact names: any ignored entry naming one of its experts."""
    name = f"{prefix}.{linear.name}"
    if any(_matches(fp8, name, e) for e in fp8.ignored):
        return True
    if linear.copies > 1 and fp8.match == "exact":
        return any(name in e for e in fp8.ignored if "experts" in e)
    last = linear.name.rsplit(".", 1)[-1]
    return bool(linear.parts) and all(
        any(_matches(fp8, name.removesuffix(last) + part, e) for e in fp8.ignored)
        for part in linear.parts
    )


def _fp8_linear_bytes(fp8: Fp8Weights, linear: Linear) -> int:
    """One FP8 linear layer: a byte per weight plus float32 scales (per shard, per output row or
    per block tile) and, with static activations, one input scale per shard."""
    n, k = sum(linear.shards), linear.k
    if fp8.scheme == "tensor":
        # online: one scale for the fused layer (Fp8PerTensorOnlineLinearMethod's amax)
        scales = 1 if fp8.online else len(linear.shards)
    elif fp8.scheme == "channel":
        scales = n
    else:
        scales = math.ceil(n / fp8.block[0]) * math.ceil(k / fp8.block[1])
    scales += len(linear.shards) if fp8.static_input else 0
    return linear.copies * (n * k + scales * SCALE_BYTES)


def _linear_bytes(s: ModelShape, prefix: str, linears: list[Linear]) -> int:
    """Bytes of one decoder layer's linear layers: the model's dtype, or FP8 weights with their
    scale tensors for the layers the quantization config does not ignore."""
    total = 0
    for linear in linears:
        if s.fp8 is None or _ignored(s.fp8, prefix, linear):
            total += linear.copies * sum(linear.shards) * linear.k * s.dtype_bytes
        else:
            total += _fp8_linear_bytes(s.fp8, linear)
    return total


#: Bytes per element of the DSA indexer's k_norm (vLLM 0.33.0: LayerNorm(head_dim, FP32)).
INDEXER_NORM_BYTES = 4


def _indexer_bytes(s: ModelShape) -> int:
    """One layer's DSA indexer beside wq_b (vLLM 0.33.0's DeepseekV32Indexer): the fused key
    and head-weight projection wk_weights_proj (hidden -> head_dim + heads, built with
    quant_config None, so in the model's dtype whatever the checkpoint) and k_norm, a
    LayerNorm's weight and bias in FP32. Replicated under TP (disable_tp)."""
    if not s.sparse:
        return 0
    wk_weights_proj = s.hidden * (s.index_head_dim + s.index_n_heads) * s.dtype_bytes
    return wk_weights_proj + 2 * s.index_head_dim * INDEXER_NORM_BYTES


def _norm_params(s: ModelShape) -> int:
    """Per-layer elements outside linear layers: two RMSNorms, q/k norms, MLA's latent norms."""
    extra = 2 * s.head_dim if s.qk_norm else 0
    if s.family == "mla":
        extra += s.q_lora_rank + s.kv_lora_rank
    return 2 * s.hidden + extra


def _dflash_elems(s: ModelShape, target_vocab: int | None) -> int:
    """A DFlash/DSpark drafter's elements beside its layers and fc (vLLM 0.33.0's
    qwen3_dflash.py, qwen3_dspark.py and load_dspark_model): the mask embedding and hidden norm;
    embed_tokens and lm_head only where the target's cannot be shared (a larger input vocabulary,
    another output vocabulary); DSpark's Markov head, an embedding and a projection of
    vocabulary x markov_rank."""
    h, vocab = s.hidden, padded_vocab(s)
    shared = target_vocab if target_vocab is not None else s.vocab
    elems = 2 * h  # mask_embedding, hidden_norm
    elems += 0 if s.vocab <= shared else vocab * h  # embed_tokens
    elems += 0 if s.vocab == shared else vocab * h  # lm_head
    return elems + s.markov_rank * (s.vocab + vocab)


def parameter_bytes(s: ModelShape, target_vocab: int | None = None) -> int:
    """Bytes of one rank's weights: embeddings, layers, norms, lm_head (once when tied), the
    rotary cos/sin cache, a DSA model's indexer per layer, and an EAGLE3 drafter's fc (3 x hidden -> hidden); a DFlash/DSpark
    drafter's fc and heads, with ``target_vocab`` deciding what it shares. FP8 models
    (``s.fp8``): linear layers at one byte per weight plus scales, except ignored layers; the
    rest in the model's dtype, with each attention layer's scalar q/k/v/prob scales."""
    h = s.hidden
    vocab = padded_vocab(s)
    linear = sum(
        _linear_bytes(
            s,
            f"model.layers.{i}",
            _attention_linears(s) + _mlp_linears(s, s.is_moe_layer(i)),
        )
        for i in range(s.num_layers)
    )
    elems = s.num_layers * _norm_params(s) + h  # final norm
    elems += s.moe_layers * _router_gate_elems(s)
    if s.extra_input_hidden:  # EAGLE3: embeddings and lm_head are the target's; fc and norms
        linear += _linear_bytes(s, "model", [Linear("fc", (h,), 3 * h)])
        elems += 2 * h
    elif s.dflash_aux_layers:
        linear += _linear_bytes(s, "model", [Linear("fc", (h,), s.dflash_aux_layers * h)])
        elems += _dflash_elems(s, target_vocab)
    else:
        elems += vocab * h * (1 if s.tied else 2)
    rope_dim = s.qk_rope_head_dim if s.family == "mla" else s.head_dim
    elems += s.max_position * rope_dim
    indexer = s.num_layers * _indexer_bytes(s)
    return elems * s.dtype_bytes + linear + indexer + _attention_scale_bytes(s)

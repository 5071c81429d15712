"""A hybrid model's KV-cache groups before any start, from config.json (vLLM 0.33.0's sizing).

Each layer's spec is its kind's (memest.estimate.layer_kinds): full or sliding-window attention
with the target's KV heads and head size in --kv-cache-dtype, MLA's latent, or a linear-attention
/ Mamba state (memest.estimate.linear_attention). With state layers the platform first raises the
attention block size until one attention page holds a state, and pads the state to that page
(memest.estimate.kv_groups.mamba_attention_block_size); prefix caching is on by default in vLLM
0.33.0, which puts state layers in ``align`` mode. The groups themselves are
memest.estimate.kv_groups.group_layers: the arithmetic a recorded start's groups use too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memest.estimate import kv_groups, linear_attention
from memest.estimate.kv import kv_cache_dtype_bytes
from memest.estimate.kv_groups import LayerCache
from memest.estimate.layer_kinds import (
    NO_CACHE_KINDS,
    STATE_KINDS,
    LayerKind,
    is_hybrid,
    layer_kinds,
    sliding_window,
)
from memest.preflight.backends import KERNEL_BLOCKS
from memest.schema import KVCacheSpec

if TYPE_CHECKING:
    from memest.preflight.predict import Setup

#: vLLM 0.33.0 enables prefix caching for decoder models by default, so state layers run in
#: ``align`` mode (MambaModelConfig.verify_and_update_config).
DEFAULT_ALIGN = True
#: A hybrid MLA/Mamba model's attention block is a multiple of 128 tokens (vLLM 0.33.0's
#: Platform.update_block_size_for_backend, for the MLA decode kernels).
MLA_MAMBA_BLOCK_ALIGNMENT = 128


def _attention_page_per_token(s: Setup, kind: LayerKind) -> int:
    """Bytes one token takes in one attention layer (FullAttentionSpec with block_size 1)."""
    t = s.target
    size = kv_cache_dtype_bytes(s.config.kv_cache_dtype, t.dtype_bytes)
    if kind == "mla":
        return (t.kv_lora_rank + t.qk_rope_head_dim) * size
    return 2 * t.kv_heads * t.head_dim * size


def _states(
    cfg: Mapping[str, Any], s: Setup, kinds: tuple[LayerKind, ...], align: bool
) -> dict[LayerKind, linear_attention.StateShape]:
    spec_tokens = s.config.num_speculative_tokens
    return {
        k: linear_attention.state_shape(
            cfg,
            k,
            tp=s.config.tensor_parallel_size,
            dtype_bytes=s.target.dtype_bytes,
            spec_tokens=spec_tokens,
        )
        for k in sorted(set(kinds) & set(STATE_KINDS))
    }


def attention_block_size(
    s: Setup, kinds: tuple[LayerKind, ...], states: Mapping[LayerKind, Any], align: bool
) -> int:
    """The attention block size: --block-size / the backend's, raised for state layers."""
    if not states:
        return s.block_size
    attn = next(k for k in kinds if k not in STATE_KINDS and k not in NO_CACHE_KINDS)
    smallest = min(KERNEL_BLOCKS.get(s.attention_backend, (16,)))
    alignment = max(smallest, s.block_size)
    if attn == "mla":  # TRTLLM/FlashInfer MLA decode kernels need 128-aligned blocks
        alignment = max(alignment, MLA_MAMBA_BLOCK_ALIGNMENT)
    if align:
        alignment = math.lcm(alignment, linear_attention.checkpoint_alignment(set(kinds)))
    largest = max(st.bytes for st in states.values())
    return kv_groups.mamba_attention_block_size(
        _attention_page_per_token(s, attn), largest, s.block_size, alignment, smallest
    )


def layer_caches(
    cfg: Mapping[str, Any], s: Setup, *, align: bool = DEFAULT_ALIGN
) -> list[LayerCache]:
    """Every cache-holding layer's spec, in layer order."""
    kinds = layer_kinds(cfg)
    states = _states(cfg, s, kinds, align)
    block = attention_block_size(s, kinds, states, align)
    out = []
    for kind in kinds:
        if kind in NO_CACHE_KINDS:
            continue
        if kind in states:
            st = states[kind]
            blocks = linear_attention.state_blocks(
                kind, align=align, spec_tokens=s.config.num_speculative_tokens
            )
            key = (st.conv_rows, st.conv_dim, *st.recurrent)
            out.append(LayerCache("mamba", block, st.bytes, state_blocks=blocks, key=key))
            continue
        page = _attention_page_per_token(s, kind) * block
        window = sliding_window(cfg) if kind == "sliding_window" else None
        group_kind = "mla" if kind == "mla" else kind
        out.append(LayerCache(group_kind, block, page, sliding_window=window))
    return out


def kv_spec(cfg: Mapping[str, Any], s: Setup, base: KVCacheSpec) -> KVCacheSpec:
    """``base`` (memest's one-group spec) with vLLM's groups when the model is a hybrid.

    Raises:
        ConfigError: a layer kind memest does not model (named), or a state field missing.
    """
    kinds = layer_kinds(cfg)
    if not is_hybrid(kinds):
        return base
    if s.drafter is not None:
        from memest.errors import ConfigError

        raise ConfigError(
            "speculative_config",
            s.config.speculative_method,
            "a hybrid's drafter layers are not grouped by memest",
        )
    return kv_groups.hybrid_spec(base, kv_groups.group_layers(layer_caches(cfg, s)))

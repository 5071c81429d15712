"""KV-cache bytes to tokens from the KV-cache spec (layers, heads, head size, dtype, block)."""

from __future__ import annotations

from typing import Any

from memest.errors import ConfigError, DoesNotFitError
from memest.estimate import kv_groups
from memest.estimate.model_shape import ModelShape
from memest.schema import KVCacheSpec
from memest.units import fmt_gib

# KVCacheSpec.extra's keys read here: MLA stores one latent vector per token and layer
# (kv_lora_rank + qk_rope_head_dim values) instead of K and V per head; a sparse-attention
# indexer adds its own per-token key cache (indexer_head_dim values plus scale bytes).

#: Bytes per element of the KV cache for vLLM 0.33.0's --kv-cache-dtype values memest models
#: (vllm/config/cache.py CacheDType, sized by vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE: the FP8 forms are stored as uint8, so
#: FullAttentionSpec.page_size_bytes halves against bf16). "auto" (None here) is the model's
#: dtype. Scale tensors: every attention layer holds four float32 scalars (_k_scale, _v_scale,
#: _q_scale, _prob_scale) whatever the dtype, so they are in the weights term, not per token.
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


#: vLLM 0.33.0's DSA indexer key cache (DeepseekV32Indexer: DeepseekV32IndexerCache of uint8):
#: FP8 values, one float32 scale per INDEXER_QUANT_BLOCK of them, whatever --kv-cache-dtype.
INDEXER_VALUE_BYTES = 1
INDEXER_QUANT_BLOCK = 128
INDEXER_SCALE_BYTES = 4


def indexer_scale_bytes(index_head_dim: int) -> int:
    """Scale bytes per token of one layer's indexer key cache (head_dim // 128 x 4 B)."""
    return index_head_dim // INDEXER_QUANT_BLOCK * INDEXER_SCALE_BYTES


def indexer_token_bytes(index_head_dim: int, value_bytes: int, scale_bytes: int) -> int:
    """Bytes one token takes in one layer's indexer key cache: values and their scales."""
    return index_head_dim * value_bytes + scale_bytes


def indexer_kv_extra(shape: ModelShape) -> dict[str, int]:
    """KVCacheSpec.extra's indexer keys for a DSA model (empty without an indexer)."""
    if not shape.sparse:
        return {}
    return {
        "indexer_head_dim": shape.index_head_dim,
        "indexer_dtype_bytes": INDEXER_VALUE_BYTES,
        "indexer_scale_bytes": indexer_scale_bytes(shape.index_head_dim),
        "indexer_num_layers": shape.num_layers,
    }


def layer_indexer_kv_bytes(shape: ModelShape) -> int:
    """Bytes one token takes in one layer's indexer key cache (0 without an indexer): 132 for
    DeepSeek-V3.2's 128-value head."""
    if not shape.sparse:
        return 0
    return indexer_token_bytes(
        shape.index_head_dim, INDEXER_VALUE_BYTES, indexer_scale_bytes(shape.index_head_dim)
    )


def kv_cache_dtype_bytes(
    kv_cache_dtype: str | None, model_dtype_bytes: int, *, field: str = "kv_cache_dtype"
) -> int:
    """Bytes per KV-cache element under ``--kv-cache-dtype`` (None or "auto": the model's).

    Raises:
        ConfigError: a dtype vLLM 0.33.0 does not take for the KV cache, or one memest does not
            model (named).
    """
    name = "auto" if kv_cache_dtype is None else kv_cache_dtype
    if not isinstance(name, str) or name.lower() not in KV_CACHE_DTYPE_BYTES:
        raise ConfigError(field, name, f"expected one of {', '.join(KV_CACHE_DTYPE_BYTES)}")
    size = KV_CACHE_DTYPE_BYTES[name.lower()]
    return model_dtype_bytes if size is None else size


def _int_extra(extra: dict[str, Any], key: str, default: int | None = None) -> int:
    value = extra.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"kv_cache.extra.{key}", value, "expected a non-negative integer")
    return value


def kv_bytes_per_token(spec: KVCacheSpec) -> int:
    """Bytes one token of KV cache takes over all layers (latent and indexer caches included).

    Raises:
        ConfigError: the spec lacks the sizes its kind needs, or gives zero bytes per token.
    """
    if spec.groups:
        # a hybrid's pool: one block id's bytes over its smallest block size (kv_groups.py)
        return kv_groups.bytes_per_block(spec) // spec.block_size
    if spec.page_size_bytes is not None:
        per_token = spec.page_size_bytes // spec.block_size
        if per_token <= 0 or spec.page_size_bytes % spec.block_size:
            raise ConfigError(
                "kv_cache.page_size_bytes",
                spec.page_size_bytes,
                f"must be a positive multiple of block_size={spec.block_size}",
            )
        return per_token
    extra = spec.extra
    if spec.kind == "mla" or "kv_lora_rank" in extra:
        latent = _int_extra(extra, "kv_lora_rank") + _int_extra(extra, "qk_rope_head_dim", 0)
        per_layer = latent * spec.dtype_bytes
    else:
        if spec.num_kv_heads <= 0 or spec.head_size <= 0:
            raise ConfigError(
                "kv_cache",
                f"num_kv_heads={spec.num_kv_heads}, head_size={spec.head_size}",
                "full attention needs positive num_kv_heads and head_size",
            )
        per_layer = 2 * spec.num_kv_heads * spec.head_size * spec.dtype_bytes
    per_token = per_layer * spec.num_layers
    if "indexer_head_dim" in extra:
        idx_layers = _int_extra(extra, "indexer_num_layers", spec.num_layers)
        idx_bytes = indexer_token_bytes(
            _int_extra(extra, "indexer_head_dim"),
            _int_extra(extra, "indexer_dtype_bytes", INDEXER_VALUE_BYTES),
            _int_extra(extra, "indexer_scale_bytes", 0),
        )
        per_token += idx_layers * idx_bytes
    if per_token <= 0:
        raise ConfigError(
            "kv_cache.num_layers", spec.num_layers, "the spec holds zero bytes per token"
        )
    return per_token


def layer_kv_bytes(shape: ModelShape, kv_cache_dtype: str | None = None) -> int:
    """Bytes one token of KV cache takes in one attention layer of ``shape`` (per rank): K and V
    per KV head, or MLA's latent vector, in ``kv_cache_dtype`` (None or "auto": the model's)."""
    size = kv_cache_dtype_bytes(kv_cache_dtype, shape.dtype_bytes)
    if shape.family == "mla":
        return shape.kv * size
    return 2 * shape.kv_heads * shape.head_dim * size


def rescale_kv_dtype(spec: KVCacheSpec, dtype_bytes: int, dtype: str) -> KVCacheSpec:
    """``spec`` with its elements ``dtype_bytes`` wide: every layer's K and V (or latent) scale
    with the element size, as FullAttentionSpec/MLAAttentionSpec.page_size_bytes do.

    Raises:
        ConfigError: the spec holds an indexer cache (its own dtype; not rescaled by memest).
    """
    if "indexer_head_dim" in spec.extra:
        raise ConfigError(
            "kv_cache_dtype", dtype, "a sparse-attention indexer cache is not rescaled by memest"
        )
    if spec.groups:
        raise ConfigError(
            "kv_cache_dtype", dtype, "a hybrid's KV-cache groups are not rescaled by memest"
        )
    if dtype_bytes == spec.dtype_bytes:
        return spec
    per_token = kv_bytes_per_token(spec) * dtype_bytes // spec.dtype_bytes
    return spec.model_copy(
        update={
            "dtype": dtype,
            "dtype_bytes": dtype_bytes,
            "page_size_bytes": per_token * spec.block_size,
            "num_blocks": None,
            "kv_tokens": None,
        }
    )


def kv_page_bytes(spec: KVCacheSpec) -> int:
    """Bytes of one block (``block_size`` tokens) over all layers; a hybrid's: one block id of
    its pool (the largest group's pages)."""
    if spec.groups:
        return kv_groups.bytes_per_block(spec)
    return kv_bytes_per_token(spec) * spec.block_size


def kv_cache_bytes(spec: KVCacheSpec, kv_bytes: int) -> int:
    """Bytes of the whole blocks ``kv_bytes`` holds (what vLLM allocates of its budget)."""
    page = kv_page_bytes(spec)
    return kv_bytes // page * page


def hybrid_lengths(
    spec: KVCacheSpec, max_model_len: int | None, max_num_batched_tokens: int | None
) -> kv_groups.Lengths:
    """The lengths a hybrid's tokens depend on.

    Raises:
        ConfigError: a length is missing (a hybrid's tokens depend on both).
    """
    for name, value in (
        ("max_model_len", max_model_len),
        ("max_num_batched_tokens", max_num_batched_tokens),
    ):
        if value is None:
            raise ConfigError(
                name, value, f"a hybrid's KV tokens ({len(spec.groups)} KV-cache groups) need it"
            )
    assert max_model_len is not None and max_num_batched_tokens is not None
    return kv_groups.Lengths(max_model_len, max_num_batched_tokens)


def kv_tokens(
    spec: KVCacheSpec,
    kv_bytes: int,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> int:
    """Tokens of KV cache that ``kv_bytes`` holds: whole blocks only, as vLLM allocates them.

    A hybrid (spec.groups) holds vLLM's "GPU KV cache size" tokens: its max concurrency at
    ``max_model_len`` times max_model_len (memest.estimate.kv_groups).

    Raises:
        ConfigError: ``kv_bytes`` is negative, the spec is incomplete, or a hybrid's lengths
            are missing.
    """
    if kv_bytes < 0:
        raise ConfigError("kv_bytes", kv_bytes, "must not be negative")
    if spec.groups:
        lengths = hybrid_lengths(spec, max_model_len, max_num_batched_tokens)
        return kv_groups.kv_tokens(spec, kv_bytes, lengths)
    return (kv_bytes // kv_page_bytes(spec)) * spec.block_size


def require_fit(
    non_kv_bytes: int,
    budget_bytes: int,
    *,
    field: str = "gpu_memory_utilization",
    value: object = None,
) -> None:
    """Refuse a configuration whose non-KV memory fills its whole budget.

    vLLM 0.33.0 refuses to start when no KV block fits; a figure of 0 KV tokens would hide that.

    Raises:
        DoesNotFitError: "does not fit: non-KV X GiB > budget Y GiB".
    """
    if non_kv_bytes >= budget_bytes:
        raise DoesNotFitError(
            field,
            value,
            f"does not fit: non-KV {fmt_gib(non_kv_bytes)} GiB > budget "
            f"{fmt_gib(budget_bytes)} GiB ({field}" + ("" if value is None else f"={value}") + ")",
        )


def require_max_model_len(spec: KVCacheSpec, kv_bytes: int, max_model_len: int) -> None:
    """Refuse a KV cache that cannot hold one request of ``max_model_len`` tokens.

    vLLM 0.33.0 refuses such a start ("max seq len ... larger than the available KV cache").

    Raises:
        DoesNotFitError: naming the KV bytes one request needs and what the budget leaves.
    """
    if spec.groups:
        needed = kv_groups.blocks_per_request(
            spec, kv_groups.Lengths(max_model_len, max_model_len)
        ) * kv_groups.bytes_per_block(spec)
    else:
        needed = -(-max_model_len // spec.block_size) * kv_page_bytes(spec)
    if kv_bytes < needed:
        raise DoesNotFitError(
            "max_model_len",
            max_model_len,
            f"does not fit: one request of max_model_len {max_model_len:,} tokens needs "
            f"{fmt_gib(needed)} GiB of KV cache, the budget leaves {fmt_gib(kv_bytes)} GiB",
        )

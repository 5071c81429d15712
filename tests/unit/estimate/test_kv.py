from __future__ import annotations

import pytest

from memest.errors import ConfigError
from memest.estimate import kv_bytes_per_token, kv_page_bytes, kv_tokens
from memest.schema import KVCacheSpec
from memest.units import GiB

LLAMA_8B = KVCacheSpec(num_layers=32, num_kv_heads=8, head_size=128, dtype_bytes=2, block_size=16)


def test_full_attention_llama_8b() -> None:
    # 32 layers x (K + V) x 8 heads x 128 x 2 B = 128 KiB per token
    assert kv_bytes_per_token(LLAMA_8B) == 131072
    assert kv_page_bytes(LLAMA_8B) == 2 * 1024 * 1024
    assert kv_tokens(LLAMA_8B, GiB) == 8192


def test_partial_block_is_not_counted() -> None:
    page = kv_page_bytes(LLAMA_8B)
    assert kv_tokens(LLAMA_8B, 3 * page - 1) == 2 * 16


def test_mla_latent_and_indexer_caches() -> None:
    # DeepSeek-style: one 512 + 64 latent per token and layer in bf16, plus an fp8 indexer key
    # cache of 128 values and a 4-byte scale per token and layer.
    spec = KVCacheSpec(
        kind="mla",
        num_layers=61,
        dtype_bytes=2,
        block_size=64,
        extra={
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "indexer_head_dim": 128,
            "indexer_dtype_bytes": 1,
            "indexer_scale_bytes": 4,
        },
    )
    per_token = 61 * (576 * 2) + 61 * (128 + 4)
    assert kv_bytes_per_token(spec) == per_token
    assert kv_tokens(spec, 10 * per_token * 64) == 640


def test_page_size_from_the_spec_wins() -> None:
    spec = LLAMA_8B.model_copy(update={"page_size_bytes": 1024 * 16})
    assert kv_tokens(spec, 1024 * 16 * 5) == 80


def test_negative_bytes_are_refused() -> None:
    with pytest.raises(ConfigError, match="kv_bytes=-1"):
        kv_tokens(LLAMA_8B, -1)


def test_incomplete_spec_is_named() -> None:
    with pytest.raises(ConfigError, match="num_kv_heads=0"):
        kv_tokens(KVCacheSpec(num_layers=32, block_size=16), GiB)
    with pytest.raises(ConfigError, match="kv_cache.extra.kv_lora_rank"):
        kv_tokens(KVCacheSpec(kind="mla", num_layers=2, block_size=16), GiB)

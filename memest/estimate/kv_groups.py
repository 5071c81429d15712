"""KV capacity of a hybrid model as vLLM 0.33.0 computes it, per KV-cache group.

vLLM's hybrid allocator (``vllm/v1/core/kv_cache_planning.py`` get_kv_cache_groups and
get_kv_cache_config_from_groups, ``vllm/v1/core/kv_cache_utils.py``
get_max_concurrency_for_kv_cache_config, the specs in ``vllm/v1/kv_cache_interface.py``):

1. every layer has a spec: FullAttentionSpec / MLAAttentionSpec (a page per block of tokens),
   SlidingWindowSpec (the same page; a request holds only the window's blocks), MambaSpec (one
   state per block, a request holds a fixed number of them);
2. page sizes are unified: a smaller attention page takes a larger block size when it divides
   the largest page, else it is padded, and a Mamba state is padded to the page (the platform has
   already raised the attention block size so that its page holds one state);
3. layers are bucketed by spec and each bucket is cut into groups of the same size (the smallest
   bucket's layer count, or the largest when it is under 1.5 times the smallest), the last group
   of a bucket padded;
4. one pool of blocks: ``num_blocks = available // bytes_per_block``, a block being the largest
   group's pages (every group's layer i shares one tensor), so every group gets the same count;
5. a request at max_model_len takes ``cdiv(max_memory_usage_bytes, page)`` blocks of each group;
   max concurrency is num_blocks over their sum, the logged token count is that times
   max_model_len ("GPU KV cache size: N tokens, Maximum concurrency for L tokens per request").

A model whose layers all share one spec type is one group (the uniform cases of step 1): memest's
plain KVCacheSpec without groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memest.errors import ConfigError
from memest.schema import KVCacheGroup, KVCacheSpec

#: vLLM's heuristic: cut buckets by the largest layer count when under this times the smallest.
GROUP_SIZE_SLACK = 1.5
#: Batches in flight at once under async scheduling (VllmConfig.max_concurrent_batches, PP=1):
#: a sliding window holds the blocks of every in-flight batch (max_in_flight_tokens).
ASYNC_CONCURRENT_BATCHES = 2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class LayerCache:
    """One layer's KV-cache spec (before grouping): what vLLM's get_kv_cache_spec returns."""

    kind: str  # KVCacheGroup.kind
    block_size: int
    page_bytes: int  # the unpadded page: block_size tokens, or one state
    padded_page: int | None = None
    sliding_window: int | None = None
    state_blocks: int | None = None  # MambaSpec: states a request holds
    key: tuple[int, ...] = ()  # what else tells specs of one kind apart (heads, state shapes)

    @property
    def page(self) -> int:
        return self.padded_page if self.padded_page is not None else self.page_bytes


@dataclass(frozen=True, slots=True)
class Lengths:
    """The lengths a request's blocks depend on."""

    max_model_len: int
    max_num_batched_tokens: int
    concurrent_batches: int = ASYNC_CONCURRENT_BATCHES

    @property
    def in_flight_tokens(self) -> int:
        return self.concurrent_batches * self.max_num_batched_tokens


def unify_page_sizes(layers: Sequence[LayerCache]) -> list[LayerCache]:
    """vLLM's unify_kv_cache_spec_page_size: smaller pages take a larger block or are padded.

    Raises:
        ConfigError: an MLA page that neither divides the largest page nor can be padded.
    """
    largest = max(layer.page for layer in layers)
    out = []
    for layer in layers:
        if layer.page == largest:
            out.append(layer)
        elif layer.kind == "mamba":
            out.append(replace(layer, padded_page=largest))
        elif largest % layer.page == 0:
            ratio = largest // layer.page
            out.append(replace(layer, block_size=layer.block_size * ratio, page_bytes=largest))
        elif layer.kind != "mla":
            out.append(replace(layer, padded_page=largest))
        else:
            raise ConfigError(
                "kv_cache", layer.page, f"an MLA page that does not divide {largest} B"
            )
    return out


def _bucket_key(layer: LayerCache) -> tuple[object, ...]:
    return (layer.kind, layer.block_size, layer.page, layer.sliding_window, layer.key)


def group_layers(layers: Sequence[LayerCache]) -> list[KVCacheGroup]:
    """vLLM's KV-cache groups of a hybrid model's layers (steps 2 and 3 above)."""
    buckets: dict[tuple[object, ...], list[LayerCache]] = {}
    for layer in unify_page_sizes(layers):
        buckets.setdefault(_bucket_key(layer), []).append(layer)
    counts = [len(b) for b in buckets.values()]
    size = min(counts)
    if max(counts) < min(counts) * GROUP_SIZE_SLACK:
        size = max(counts)
    groups = []
    for bucket in buckets.values():
        n = cdiv(len(bucket), size)
        for i in range(n):
            members = bucket[i::n]
            first = members[0]
            groups.append(
                KVCacheGroup(
                    kind=first.kind,
                    num_layers=len(members),
                    padding_layers=size - len(members),
                    block_size=first.block_size,
                    page_size_bytes=first.page,
                    real_page_size_bytes=first.page_bytes if first.kind == "mamba" else None,
                    sliding_window=first.sliding_window,
                    state_blocks=first.state_blocks,
                )
            )
    return groups


def hybrid_spec(base: KVCacheSpec, groups: list[KVCacheGroup]) -> KVCacheSpec:
    """``base`` (the attention layers' heads, dtype) with vLLM's groups: kind "hybrid"."""
    block = min(g.block_size for g in groups)
    return base.model_copy(
        update={
            "kind": "hybrid",
            "num_layers": sum(g.num_layers for g in groups),
            "block_size": block,
            "page_size_bytes": None,
            "groups": groups,
        }
    )


def bytes_per_block(spec: KVCacheSpec) -> int:
    """Bytes one block id takes in the pool: the largest group's pages (padding slots
    included: every group's layer i shares one tensor)."""
    return max((g.num_layers + g.padding_layers) * g.page_size_bytes for g in spec.groups)


def num_blocks(spec: KVCacheSpec, kv_bytes: int) -> int:
    """Blocks of the one pool every group draws from."""
    if kv_bytes < 0:
        raise ConfigError("kv_bytes", kv_bytes, "must not be negative")
    return kv_bytes // bytes_per_block(spec)


def group_blocks_per_request(group: KVCacheGroup, lengths: Lengths) -> int:
    """Blocks of ``group`` one request of max_model_len holds (max_memory_usage_bytes / page)."""
    mml = lengths.max_model_len
    if group.kind == "mamba":
        return group.state_blocks or 1
    if group.kind == "sliding_window":
        assert group.sliding_window is not None
        tokens = min(group.sliding_window - 1 + lengths.in_flight_tokens, mml)
        # +1: the window need not start on a block boundary
        return cdiv(tokens, group.block_size) + 1
    return cdiv(mml, group.block_size)


def blocks_per_request(spec: KVCacheSpec, lengths: Lengths) -> int:
    """Blocks of the pool one request of max_model_len holds, over all groups."""
    return sum(group_blocks_per_request(g, lengths) for g in spec.groups)


def max_concurrency(spec: KVCacheSpec, kv_bytes: int, lengths: Lengths) -> float:
    """vLLM's "Maximum concurrency for max_model_len tokens per request"."""
    return num_blocks(spec, kv_bytes) / blocks_per_request(spec, lengths)


def kv_tokens(spec: KVCacheSpec, kv_bytes: int, lengths: Lengths) -> int:
    """vLLM's "GPU KV cache size: N tokens": max concurrency times max_model_len."""
    return int(max_concurrency(spec, kv_bytes, lengths) * lengths.max_model_len)


def bytes_for_requests(spec: KVCacheSpec, requests: float, lengths: Lengths) -> int:
    """KV bytes that hold ``requests`` requests of max_model_len (whole blocks of the pool)."""
    return math.ceil(requests * blocks_per_request(spec, lengths)) * bytes_per_block(spec)


def group_shares(spec: KVCacheSpec, lengths: Lengths) -> list[float]:
    """Each group's share of the pool a request at max_model_len takes (sums to 1)."""
    per = [group_blocks_per_request(g, lengths) for g in spec.groups]
    total = sum(per)
    return [p / total for p in per]


def mamba_attention_block_size(
    attn_page_per_token: int,
    state_bytes: int,
    block_size: int,
    alignment: int,
    backend_alignment: int,
) -> int:
    """The attention block size vLLM's platform sets so that an attention page holds one state
    (Platform.update_block_size_for_backend): the smallest multiple of ``alignment`` (the
    backend's smallest kernel block or --block-size if larger, lcm'd with the prefill checkpoint
    alignment in align mode) whose page holds ``state_bytes``, rounded up to every backend's
    smallest kernel block; never below ``block_size``."""
    size = alignment * cdiv(state_bytes, alignment * attn_page_per_token)
    size = backend_alignment * cdiv(size, backend_alignment)
    return max(size, block_size)

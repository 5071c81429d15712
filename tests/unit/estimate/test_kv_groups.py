"""Hybrid KV capacity per group, checked against a real H200 start's vLLM figures (call 44's
Gemma-3-class start G: five sliding-window layers and one full-attention layer)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memest.errors import ConfigError
from memest.estimate import kv_groups
from memest.estimate.kv import kv_cache_bytes, kv_tokens, require_max_model_len
from memest.estimate.kv_groups import LayerCache, Lengths
from memest.schema import KVCacheSpec

STARTS = Path(__file__).resolve().parents[2] / "data" / "starts"
#: vLLM's capacity line (kv_cache_utils.update_kv_cache_capacity)
CAPACITY = re.compile(
    r"GPU KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
    r"([\d.]+)x"
)


def _record() -> dict:
    return json.loads((STARTS / "results.call44.G_alone.jsonl").read_text())


def _logged() -> tuple[int, int, float]:
    text = (STARTS / "call44-logs" / "G_gemma3_6l_s128_t4096.alone.log").read_text()
    m = CAPACITY.search(text)
    assert m is not None
    return int(m[1].replace(",", "")), int(m[2].replace(",", "")), float(m[3])


def _spec_from_record(rec: dict) -> KVCacheSpec:
    """The groups as the harness recorded them from vLLM's KVCacheConfig."""
    groups = []
    for g in rec["kv_groups"]["groups"]:
        sliding = g["spec"] == "SlidingWindowSpec"
        groups.append(
            LayerCache(
                "sliding_window" if sliding else "full_attention",
                g["block_size"],
                g["page_size_bytes"],
                sliding_window=g["sliding_window"],
            )
        )
    base = KVCacheSpec(num_layers=len(groups), num_kv_heads=4, head_size=256, block_size=16)
    return kv_groups.hybrid_spec(base, kv_groups.group_layers(groups))


def test_gemma3_start_tokens_and_concurrency_are_vllms() -> None:
    rec = _record()
    tokens, mml, concurrency = _logged()
    spec = _spec_from_record(rec)
    assert len(spec.groups) == 6
    budget = rec["vllm_available_kv_bytes"]
    assert kv_groups.num_blocks(spec, budget) == rec["num_gpu_blocks"] == 1_872_136
    lengths = Lengths(mml, 4096)  # --max-num-batched-tokens 4096
    assert kv_tokens(spec, budget, mml, 4096) == tokens == 4_976_164
    assert round(kv_groups.max_concurrency(spec, budget, lengths), 2) == concurrency


def test_groups_cut_buckets_by_the_smallest_count() -> None:
    # 10 sliding + 2 full: groups of 2 layers, five sliding groups and one full
    layers = [LayerCache("sliding_window", 16, 65536, sliding_window=1024)] * 10
    layers += [LayerCache("full_attention", 16, 65536)] * 2
    groups = kv_groups.group_layers(layers)
    assert [(g.kind, g.num_layers) for g in groups] == [("sliding_window", 2)] * 5 + [
        ("full_attention", 2)
    ]


def test_close_counts_take_the_largest_and_pad() -> None:
    # 12 sliding + 13 full (gpt-oss-20b with a drafter): 13 under 1.5 x 12, groups of 13
    layers = [LayerCache("sliding_window", 16, 32768, sliding_window=128)] * 12
    layers += [LayerCache("full_attention", 16, 32768)] * 13
    groups = kv_groups.group_layers(layers)
    assert [(g.num_layers, g.padding_layers) for g in groups] == [(12, 1), (13, 0)]
    spec = kv_groups.hybrid_spec(KVCacheSpec(num_layers=25, block_size=16), groups)
    assert kv_groups.bytes_per_block(spec) == 13 * 32768


def test_smaller_pages_take_larger_blocks_and_states_are_padded() -> None:
    layers = [
        LayerCache("full_attention", 16, 32768),
        LayerCache("full_attention", 16, 65536, key=(1,)),
        LayerCache("mamba", 16, 60000, state_blocks=2),
    ]
    unified = kv_groups.unify_page_sizes(layers)
    assert [(u.block_size, u.page) for u in unified] == [(32, 65536), (16, 65536), (16, 65536)]
    assert unified[2].page_bytes == 60000


def test_a_state_group_holds_its_states_whatever_the_length() -> None:
    state = LayerCache("mamba", 576, 1_179_648, state_blocks=3)
    full = LayerCache("full_attention", 576, 1_179_648)
    spec = kv_groups.hybrid_spec(
        KVCacheSpec(num_layers=4, block_size=576), kv_groups.group_layers([state] * 3 + [full])
    )
    short, long = Lengths(4096, 2048), Lengths(65536, 2048)
    # 3 state groups x 3 states + cdiv(L, 576) blocks of the full group
    assert kv_groups.blocks_per_request(spec, short) == 9 + 8
    assert kv_groups.blocks_per_request(spec, long) == 9 + 114


def test_a_window_group_stops_growing_past_the_window() -> None:
    g = kv_groups.group_layers([LayerCache("sliding_window", 16, 65536, sliding_window=1024)])[0]
    # min(window - 1 + 2 x max_num_batched_tokens, L) tokens, +1 block
    assert kv_groups.group_blocks_per_request(g, Lengths(4096, 512)) == 129
    assert kv_groups.group_blocks_per_request(g, Lengths(131072, 512)) == 129
    assert kv_groups.group_blocks_per_request(g, Lengths(1024, 512)) == 65


def test_a_hybrids_tokens_need_its_lengths() -> None:
    spec = _spec_from_record(_record())
    with pytest.raises(ConfigError, match="max_model_len"):
        kv_tokens(spec, 1 << 30)


def test_whole_blocks_and_one_request() -> None:
    spec = _spec_from_record(_record())
    assert kv_cache_bytes(spec, 65536 * 10 + 5) == 65536 * 10
    with pytest.raises(ConfigError, match="does not fit"):
        require_max_model_len(spec, 65536 * 1000, 4096)  # needs 1,541 blocks


def test_mamba_block_size_is_qwen3_nexts_576() -> None:
    # call 44's Qwen3-Next start: "Setting attention block size to 576 tokens" (GDN state
    # 1,097,728 B, 2,048 B per attention token, align mode's 64-token checkpoint grid)
    assert kv_groups.mamba_attention_block_size(2048, 1_097_728, 16, 64, 16) == 576

"""A hybrid's own terms, hand-derived from vLLM 0.33.0's code (the vLLM-class oracles are
tests/integration/test_vllm_hybrid_block_tables.py and tests/unit/preflight/test_hybrid_weights_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path

from memest.estimate.hybrid_terms import weight_bytes
from memest.estimate.model_shape import model_shape
from memest.estimate.runner_buffers import GroupTable, ModelDims, RunnerGrid, runner_buffer_bytes
from memest.schema import KVCacheGroup

ROOT = Path(__file__).resolve().parents[3]
GEMMA3_6L = ROOT / "lab/models/gemma3_6l/config.json"


def test_gemma3_weights_tie_the_head_and_hold_a_rotary_cache_per_layer_type() -> None:
    cfg = json.loads(GEMMA3_6L.read_text())
    embed = 262_144 * 2560  # tied: Gemma3TextConfig's default, no lm_head of its own
    layer = (
        2560 * (8 * 256 + 2 * 4 * 256)  # qkv_proj
        + 8 * 256 * 2560  # o_proj
        + 2560 * 2 * 10240  # gate_up_proj
        + 10240 * 2560  # down_proj
        + 4 * 2560  # input, post-attention, pre- and post-feedforward norms
        + 2 * 256  # q_norm, k_norm
    )
    params = embed + 6 * layer + 2560  # final norm
    # sliding layers: default rope at 131,072 positions; the full layer: linear scaling x 8
    rope = (131_072 + 131_072 * 8) * 256
    assert weight_bytes(cfg, model_shape(cfg, tp=1)) == (params + rope) * 2


def test_a_dense_architecture_keeps_the_shape_law() -> None:
    cfg = json.loads((ROOT / "tests/data/configs/llama8b.json").read_text())
    assert weight_bytes(cfg, model_shape(cfg, tp=1)) is None


def _grid(tables: tuple[GroupTable, ...], length: int = 4096) -> RunnerGrid:
    return RunnerGrid(128, 4096, length, block_size=16, tables=tables)


def test_block_tables_are_one_per_group() -> None:
    dims = ModelDims(hidden_size=2560, vocab_size=262_144)
    six = tuple(GroupTable(16) for _ in range(6))  # Gemma-3 6L: 5 sliding groups + 1 full
    # per group two int32 tables of 128 requests x 256 blocks, one int64 slot row per token
    want = 6 * 2 * 128 * 256 * 4 + 6 * 4096 * 8
    assert runner_buffer_bytes(dims, _grid(six))["block_tables"] == want
    assert runner_buffer_bytes(dims, _grid(()))["block_tables"] == 2 * 128 * 256 * 4 + 4096 * 8


def test_a_row_is_128_token_aligned_for_attention_and_not_for_state() -> None:
    # 4,100 tokens in 16-token blocks: 257 blocks; attention rounds to 8 blocks (128 tokens)
    assert GroupTable(16).width(4100) == 264
    assert GroupTable(16, state=True, align=True, spec_tokens=2).width(4100) == 259
    assert GroupTable(16, state=True, align=False, spec_tokens=2).width(4100) == 3
    assert GroupTable(64).width(4100) == 66  # 128 tokens = 2 blocks of 64


def test_a_state_groups_mode_is_told_by_the_states_it_holds() -> None:
    def group(states: int) -> KVCacheGroup:
        return KVCacheGroup(
            kind="mamba", num_layers=3, block_size=528, page_size_bytes=1, state_blocks=states
        )

    assert GroupTable.from_group(group(3)).align  # 2 + a prefill checkpoint
    assert not GroupTable.from_group(group(1)).align
    assert not GroupTable.from_group(group(2), spec_tokens=1).align


def test_a_gated_delta_net_field_missing_is_refused_by_name() -> None:
    import pytest

    from memest.errors import ConfigError

    cfg = json.loads((ROOT / "lab/models/qwen3next_a3b_4l/config.json").read_text())
    shape = model_shape(cfg, tp=1)
    del cfg["linear_conv_kernel_dim"]
    with pytest.raises(ConfigError, match="linear_conv_kernel_dim"):
        weight_bytes(cfg, shape)

"""The fused-MoE workspace (memest.estimate.fused_moe) for few wide experts, many small experts
with shared experts, and top-k 1-8, against vLLM 0.33.0's code worked by hand.

TritonExperts.workspace_shapes (fused_moe/experts/triton_moe.py): workspace1 = (M, top_k,
max(N / 2, K)) for a gated activation, workspace2 = (M, top_k, max(N, K)), output (M, K), with
N = 2 x moe_intermediate and K = hidden; FusedMoEKernel._allocate_buffers (modular_kernel.py) asks
the workspace manager for max(workspace1, output) and workspace2 in the activation dtype, each
view rounded up to 256 B (v1/worker/workspace.py get_simultaneous), M_chunk = M_full (0.33.0
does not chunk). The expert count enters none of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.estimate.fused_moe import fused_moe_workspace_bytes, fused_moe_workspace_shapes
from memest.estimate.model_shape import model_shape

ROOT = Path(__file__).resolve().parents[3]
MIXTRAL = json.loads((ROOT / "lab/models/mixtral_4l/config.json").read_text())
DSV3 = json.loads((ROOT / "lab/models/dsv3_5l/config.json").read_text())
MiB = 1 << 20


def test_few_wide_experts_are_sized_by_the_intermediate() -> None:
    """Mixtral-class: 8 experts, top-2, intermediate 14,336 (N = 28,672), hidden 4,096, bf16, 2,048
    tokens: workspace1 2,048 x 2 x 14,336 x 2 B = 112 MiB (the output, 2,048 x 4,096, is smaller),
    workspace2 2,048 x 2 x 28,672 x 2 B = 224 MiB."""
    shape = model_shape(MIXTRAL)
    assert (shape.experts, shape.topk, shape.moe_intermediate) == (8, 2, 14336)
    assert fused_moe_workspace_shapes(shape, 2048) == (
        (2048, 2, 14336),
        (2048, 2, 28672),
        (2048, 4096),
    )
    assert fused_moe_workspace_bytes(shape, 2048) == 112 * MiB + 224 * MiB


def test_many_small_experts_are_sized_by_the_hidden_size() -> None:
    """DeepSeek-V3-class: top-8 of many experts, moe_intermediate 2,048 (N = 4,096) under hidden
    7,168: both views are (M, 8, 7,168): 2,048 x 8 x 7,168 x 2 B = 224 MiB each. The shared
    expert runs as a dense MLP outside the workspace; the expert count (64 in the lab's config,
    256 in DeepSeek-V3) changes nothing."""
    shape = model_shape(DSV3)
    assert (shape.topk, shape.moe_intermediate, shape.shared_intermediate) == (8, 2048, 2048)
    assert shape.moe_layers == 2  # 5 layers, first_k_dense_replace 3
    assert fused_moe_workspace_bytes(shape, 2048) == 2 * 224 * MiB
    assert fused_moe_workspace_bytes(model_shape(DSV3 | {"n_routed_experts": 256}), 2048) == (
        2 * 224 * MiB
    )


@pytest.mark.parametrize(
    ("top_k", "ws1_width", "ws2_width"),
    [
        (1, 14336, 28672),
        (2, 2 * 14336, 2 * 28672),
        (4, 4 * 14336, 4 * 28672),
        (8, 8 * 14336, 8 * 28672),
    ],
)
def test_top_k_scales_both_views(top_k: int, ws1_width: int, ws2_width: int) -> None:
    """Mixtral's experts with top-k 1-8, 100 tokens: (100 x width x 2 B) each, rounded to 256 B.
    At top-1 workspace1 (14,336 wide) still exceeds the output (4,096)."""
    shape = model_shape(MIXTRAL | {"num_experts_per_tok": top_k})
    expected = sum(-(-100 * w * 2 // 256) * 256 for w in (ws1_width, ws2_width))
    assert fused_moe_workspace_bytes(shape, 100) == expected


def test_odd_token_counts_round_each_view_to_256_bytes() -> None:
    """One token of DeepSeek-V3's experts: 8 x 7,168 x 2 B = 114,688 B per view, a multiple of
    256; with top-1 and hidden 7,168: 14,336 B each, also whole; a 4,095-hidden toy is not."""
    shape = model_shape(DSV3)
    assert fused_moe_workspace_bytes(shape, 1) == 2 * 114688
    toy = model_shape(
        MIXTRAL
        | {
            "hidden_size": 4095,
            "num_experts_per_tok": 1,
            "intermediate_size": 1000,
            "head_dim": 128,
        }
    )
    # workspace1 = max(1 x 1 x max(1000, 4095), output 4095) = 4,095 elements = 8,190 B -> 8,192
    # workspace2 = 1 x 1 x max(2000, 4095) = 4,095 elements -> 8,192
    assert fused_moe_workspace_bytes(toy, 1) == 2 * 8192

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
import math
from collections import Counter
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


# ------------------------------------------------------------------ against the real first step
RAW = ROOT / "tests/data/starts"


def _first_step(history: str) -> tuple[Counter[tuple[str, int]], list[int], list[int]]:
    """A recorded first full-size step (torch allocator history): the requests whose stack runs
    through vllm/model_executor/layers/fused_moe/ (by their innermost frame's file and size),
    the shared experts' dense MLP apart), the segments the step opened, and the live segments opened before it (no recorded stack)."""
    from memest.snapshot import load_snapshot

    snap = load_snapshot(RAW / history)
    ev, frames, stacks = snap["events"], snap["frames"], snap["stacks"]
    moe: Counter[tuple[str, int]] = Counter()
    opened = []
    for i in range(len(ev["action"])):
        action = snap["actions"][ev["action"][i]]
        if ev["stack"][i] < 0:
            continue
        if action == "segment_alloc":
            opened.append(ev["size"][i])
        stack = [frames[f] for f in stacks[ev["stack"][i]]]
        if action == "alloc" and any("model_executor/layers/fused_moe/" in f[0] for f in stack):
            if ev["size"][i] >= MiB:
                shared = any(f[0].endswith("shared_experts.py") for f in stack)
                moe[("shared expert" if shared else Path(stack[0][0]).name, ev["size"][i])] += 1
        assert not any(f[0].endswith("v1/worker/workspace.py") for f in stack)
    before = [
        s["total_size"]
        for s in snap["segments"]
        if s["allocated_size"] and all(b.get("stack", -1) < 0 for b in s["blocks"])
    ]
    return moe, opened, before


@pytest.mark.parametrize(
    ("history", "config", "layers", "out_bytes", "act_bytes", "workspace", "shared"),
    [
        # Mixtral: 4 MoE layers; output 2,047 x 4,096 x 2 B; activation 2,047 x 2 x 14,336 x 2 B;
        # workspace sized by the profile forward's 2,048 tokens: 112 + 224 MiB
        (
            "call35-logs/X_mixtral4l_s64_t2048.apply-hist-stephist.step.pickle.gz",
            MIXTRAL,
            4,
            16_769_024,
            117_383_168,
            336 * MiB,
            {},
        ),
        # DeepSeek-V3's mix: 2 MoE layers; output 2,047 x 7,168 x 2 B; activation 2,047 x 8 x
        # 2,048 x 2 B; workspace 2 x (2,048 x 8 x 7,168 x 2 B) = 2 x 224 MiB
        (
            "call36-logs/V3_dsv3mla5l_s64_t2048_fa.apply-hist-stephist.step.pickle.gz",
            DSV3,
            2,
            29_345_792,
            67_076_096,
            448 * MiB,
            # the shared expert (intermediate 2,048) as a dense MLP: gate_up 2,047 x 4,096,
            # SiluAndMul 2,047 x 2,048, down 2,047 x 7,168, x 2 B
            {16_769_024: 2, 8_384_512: 2, 29_345_792: 2},
        ),
    ],
)
def test_the_first_steps_fused_moe_requests_are_the_derived_ones(
    history: str,
    config: dict[str, object],
    layers: int,
    out_bytes: int,
    act_bytes: int,
    workspace: int,
    shared: dict[int, int],
) -> None:
    """Serving's first full-size step (2,047 tokens; calls 35 and 36, memest apply) against
    vLLM 0.33.0's code. The workspace (one buffer, v1/worker/workspace.py) was sized by the
    profile forward of max_num_batched_tokens = 2,048 and is live through the step, never
    requested again (2,047 <= 2,048). Per MoE layer the step asks the allocator for two things
    in fused_moe/: the layer's output (modular_kernel.py, ``hidden_states.new_empty``: (M, K),
    outside the workspace) and, on the lab's build only, two transients of intermediate_cache2's
    size (M x top_k x moe_intermediate): the C-extension shim's torch ``silu_and_mul``
    (``F.silu(x[..., :d]) * x[..., d:]``) where vLLM's CUDA kernel writes into the workspace.
    DeepSeek's shared expert runs beside them (fused_moe/runner/shared_experts.py) as a dense
    MLP of (M, width) tensors, none in the workspace."""
    shape = model_shape(config)
    assert shape.moe_layers == layers
    tokens = 2047
    ws13, ws2, out = fused_moe_workspace_shapes(shape, tokens)
    assert math.prod(out) * shape.dtype_bytes == out_bytes
    assert tokens * shape.topk * shape.moe_intermediate * shape.dtype_bytes == act_bytes
    moe, _, before = _first_step(history)
    assert moe == Counter(
        {
            ("modular_kernel.py", out_bytes): layers,
            ("functional.py", act_bytes): layers,  # F.silu's result
            ("_C_stable_libtorch.py", act_bytes): layers,  # the product, copied into the view
        }
        | {("shared expert", size): n for size, n in shared.items()}
    )
    assert fused_moe_workspace_bytes(shape, 2048) == workspace
    assert workspace in before
    assert fused_moe_workspace_bytes(shape, tokens) <= workspace


def test_mixtrals_first_step_reserved_its_pieces_and_the_shims_transients() -> None:
    """Call 35's first step reserved 312 MiB (327,155,712 B): four 16 MiB and one 24 MiB segment
    for the compiled pieces' and the MoE output's (M, 4,096) tensors, and two 112 MiB segments
    for the shim's silu_and_mul transients, which vLLM's CUDA kernel does not allocate: on a
    real build the step reserves 88 MiB."""
    rec = next(
        r
        for r in map(json.loads, (RAW / "results.call35.jsonl").read_text().splitlines())
        if r["mode"] == "apply-hist-stephist"
    )
    _, opened, _ = _first_step(
        "call35-logs/X_mixtral4l_s64_t2048.apply-hist-stephist.step.pickle.gz"
    )
    assert sum(opened) == rec["step_reserved_growth_bytes"] == 312 * MiB
    assert sorted(opened) == [16 * MiB] * 4 + [24 * MiB] + [112 * MiB] * 2

"""The torch stand-ins for vLLM's MoE and MLA ops (lab/vllm_op_standins.py) on CPU.

Each stand-in is checked against a reference written here, with plain Python loops, from the
semantics vLLM states in its tests and docs (tests/kernels/moe/test_moe_align_block_size.py,
the moe_align_block_size docstring, the routers' torch fallback, tests/kernels/attention/
test_cache.py), on random inputs of several sizes. The vLLM-marked tests call vLLM 0.33.0's own
Python wrappers (vllm/_custom_ops.py and the fused-MoE helpers) with the stand-ins registered,
so the schemas must bind the arguments vLLM passes. A fake-tensor run stands in for the
CUDA-graph check that needs a GPU: an op with a data-dependent shape or a host read fails there.
"""

from __future__ import annotations

import importlib
import math
import types
from typing import Any

import pytest

from tests.conftest import require_or_skip

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def standins() -> types.ModuleType:
    module = importlib.import_module("lab.vllm_op_standins")
    module.register(("CPU",))
    return module


@pytest.fixture(scope="module")
def vllm_ops(standins: types.ModuleType) -> Any:
    try:
        import vllm._custom_ops as ops
    except ImportError:
        require_or_skip("MEMEST_REQUIRE_VLLM", "vLLM 0.33.0 is not installed")
        raise
    return ops


# --------------------------------------------------------------------------- references
def ref_route(
    scores: list[list[float]],
    k: int,
    renormalize: bool,
    bias: list[float] | None,
    scaling: float,
    padding: list[bool] | None,
) -> tuple[list[list[float]], list[list[int]]]:
    """Per token: the k experts with the highest score (+ bias), weighted by the plain score."""
    weights, ids = [], []
    for t, row in enumerate(scores):
        if padding is not None and padding[t]:
            weights.append([0.0] * k)
            ids.append([-1] * k)
            continue
        choice = [s + (bias[e] if bias else 0.0) for e, s in enumerate(row)]
        chosen = sorted(range(len(row)), key=lambda e: (-choice[e], e))[:k]
        w = [row[e] for e in chosen]
        total = sum(w) if renormalize else 1.0
        weights.append([x / total * scaling for x in w])
        ids.append(chosen)
    return weights, ids


def ref_align(
    flat_ids: list[int],
    num_experts: int,
    block_size: int,
    capacity: int,
    expert_map: list[int] | None,
) -> tuple[list[int], list[int], int]:
    """vLLM's golden alignment: experts in order, each in whole blocks padded with numel."""
    sentinel = len(flat_ids)
    sorted_ids: list[int] = []
    block_experts: list[int] = []
    for expert in range(num_experts):
        if expert_map is not None and expert_map[expert] == -1:
            continue
        routes = [i for i, e in enumerate(flat_ids) if e == expert]
        if not routes:
            continue
        blocks = -(-len(routes) // block_size)
        sorted_ids += routes + [sentinel] * (blocks * block_size - len(routes))
        local = expert if expert_map is None else expert_map[expert]
        block_experts += [local] * blocks
    total = len(sorted_ids)
    num_blocks = -(-capacity // block_size)
    return (
        sorted_ids + [sentinel] * (capacity - total),
        block_experts + [0] * (num_blocks - len(block_experts)),
        total,
    )


def capacity_for(numel: int, num_experts: int, block_size: int) -> int:
    """The sorted_token_ids length vLLM's moe_align_block_size allocates (no pad_sorted_ids)."""
    padded = numel + num_experts * (block_size - 1)
    return min(numel * block_size, padded) if numel < num_experts else padded


def random_routes(num_tokens: int, top_k: int, num_experts: int, seed: int) -> Any:
    """Distinct experts per token, as a router picks them."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]
    return torch.stack(rows).to(torch.int32)


def align(
    topk_ids: Any, num_experts: int, block_size: int, expert_map: Any = None
) -> tuple[list[int], list[int], int, list[int]]:
    """Call the op with buffers sized as vLLM sizes them; sorted ids, block experts, padded
    total and scatter index as lists."""
    capacity = capacity_for(topk_ids.numel(), num_experts, block_size)
    sorted_ids = torch.empty(capacity, dtype=torch.int32)
    block_experts = torch.empty(-(-capacity // block_size), dtype=torch.int32)
    total = torch.empty(1, dtype=torch.int32)
    scatter = torch.empty(topk_ids.numel(), 1, dtype=torch.int32)
    torch.ops._moe_C.moe_align_block_size(
        topk_ids, num_experts, block_size, sorted_ids, block_experts, total, expert_map, scatter
    )
    return sorted_ids.tolist(), block_experts.tolist(), int(total), scatter.flatten().tolist()


# --------------------------------------------------------------------------- routers
ROUTER_SIZES = [(1, 8, 2), (7, 64, 6), (33, 128, 8), (256, 60, 4)]


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k"), ROUTER_SIZES)
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_topk_softmax_matches_reference(
    standins: types.ModuleType,
    num_tokens: int,
    num_experts: int,
    top_k: int,
    renormalize: bool,
    with_bias: bool,
) -> None:
    gen = torch.Generator().manual_seed(num_tokens * 1000 + num_experts)
    logits = torch.randn(num_tokens, num_experts, generator=gen).to(torch.bfloat16)
    bias = torch.randn(num_experts, generator=gen) * 0.05 if with_bias else None
    padding = torch.rand(num_tokens, generator=gen) < 0.25
    weights = torch.empty(num_tokens, top_k)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
    sources = torch.empty(num_tokens, top_k, dtype=torch.int32)
    torch.ops._moe_C.topk_softmax(weights, ids, sources, logits, renormalize, bias, padding)

    scores = [[float(v) for v in torch.softmax(row.float(), -1)] for row in logits]
    want_w, want_ids = ref_route(
        scores,
        top_k,
        renormalize,
        bias.tolist() if bias is not None else None,
        1.0,
        padding.tolist(),
    )
    assert ids.tolist() == want_ids
    assert torch.allclose(weights, torch.tensor(want_w), atol=1e-6)
    assert sources.tolist() == [
        [j * num_tokens + t for j in range(top_k)] for t in range(num_tokens)
    ]


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k"), ROUTER_SIZES)
def test_topk_sigmoid_scales_after_renormalising(
    standins: types.ModuleType, num_tokens: int, num_experts: int, top_k: int
) -> None:
    gen = torch.Generator().manual_seed(num_experts)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    weights = torch.empty(num_tokens, top_k)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64)
    sources = torch.empty(num_tokens, top_k, dtype=torch.int32)
    torch.ops._moe_C.topk_sigmoid(weights, ids, sources, logits, True, None, 2.5, None)

    scores = [[1.0 / (1.0 + float(torch.exp(-v))) for v in row] for row in logits]
    want_w, want_ids = ref_route(scores, top_k, True, None, 2.5, None)
    assert ids.tolist() == want_ids
    assert torch.allclose(weights, torch.tensor(want_w), atol=1e-5)


# --------------------------------------------------------------------------- alignment
ALIGN_SIZES = [(1, 1, 32, 32), (3, 2, 160, 32), (256, 8, 128, 64), (517, 6, 64, 16)]


@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts", "block_size"), ALIGN_SIZES)
def test_moe_align_block_size_matches_reference(
    standins: types.ModuleType, num_tokens: int, top_k: int, num_experts: int, block_size: int
) -> None:
    topk_ids = random_routes(num_tokens, top_k, num_experts, seed=num_tokens)
    *got, scatter = align(topk_ids, num_experts, block_size)

    capacity = capacity_for(topk_ids.numel(), num_experts, block_size)
    want = ref_align(topk_ids.flatten().tolist(), num_experts, block_size, capacity, None)
    assert tuple(got) == want
    assert scatter == list(range(topk_ids.numel()))


def test_moe_align_block_size_with_expert_map_skips_remote_experts(
    standins: types.ModuleType,
) -> None:
    num_experts, block_size = 16, 8
    topk_ids = random_routes(40, 4, num_experts, seed=7)
    topk_ids[3, 0] = -1  # a padding route
    expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
    expert_map[0::2] = torch.arange(num_experts // 2, dtype=torch.int32)
    *got, scatter = align(topk_ids, num_experts, block_size, expert_map)

    flat = topk_ids.flatten().tolist()
    emap = expert_map.tolist()
    capacity = capacity_for(topk_ids.numel(), num_experts, block_size)
    assert tuple(got) == ref_align(flat, num_experts, block_size, capacity, emap)
    local = [i if 0 <= e < num_experts and emap[e] >= 0 else -1 for i, e in enumerate(flat)]
    assert scatter == local


@pytest.mark.parametrize(("num_tokens", "top_k", "hidden"), [(1, 1, 8), (5, 2, 64), (64, 8, 96)])
def test_moe_sum_matches_reference(
    standins: types.ModuleType, num_tokens: int, top_k: int, hidden: int
) -> None:
    gen = torch.Generator().manual_seed(hidden)
    values = torch.randn(num_tokens, top_k, hidden, generator=gen)
    out = torch.empty(num_tokens, hidden)
    torch.ops._moe_C.moe_sum(values, out)
    want = [
        [sum(float(values[t, j, h]) for j in range(top_k)) for h in range(hidden)]
        for t in range(num_tokens)
    ]
    assert torch.allclose(out, torch.tensor(want, dtype=torch.float32), atol=1e-5)

    topk_ids = random_routes(num_tokens, top_k, 8, seed=hidden)
    expert_map = torch.tensor([0, -1, 1, -1, 2, -1, 3, -1], dtype=torch.int32)
    torch.ops._moe_C.moe_sum(values, out, topk_ids, expert_map)
    on_rank = [[expert_map[e] >= 0 for e in row] for row in topk_ids.tolist()]
    want = [
        [sum(float(values[t, j, h]) for j in range(top_k) if on_rank[t][j]) for h in range(hidden)]
        for t in range(num_tokens)
    ]
    assert torch.allclose(out, torch.tensor(want, dtype=torch.float32), atol=1e-5)


def test_moe_sum_reduces_into_the_output_without_a_float32_copy(
    standins: types.ModuleType,
) -> None:
    """The CUDA kernel allocates nothing; the stand-in's only op is the sum into `output`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    values = torch.randn(7, 8, 16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out = torch.empty(7, 16, dtype=torch.bfloat16)
    with Ops() as ops:
        standins.moe_sum(values, out)
    assert ops.names == ["aten.sum.IntList_out"]
    assert torch.allclose(out.float(), values.float().sum(dim=1), atol=0.1)


def test_router_alignment_and_sum_compose_into_the_moe_output(standins: types.ModuleType) -> None:
    """Read the alignment as the Triton kernel does: block b multiplies the routes listed in
    sorted_token_ids[b * block_size:][:block_size] (row // top_k is the token, numel the filler)
    by expert experts_ids[b]; moe_sum then adds each token's top-k rows."""
    num_tokens, top_k, num_experts, block_size, hidden = 20, 3, 8, 4, 5
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(num_tokens, hidden, generator=gen)
    experts = torch.randn(num_experts, hidden, hidden, generator=gen)
    weights = torch.empty(num_tokens, top_k)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
    sources = torch.empty(num_tokens, top_k, dtype=torch.int32)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    torch.ops._moe_C.topk_softmax(weights, ids, sources, logits, True, None, None)
    sorted_ids, blocks, total, _ = align(ids, num_experts, block_size)

    routed = torch.zeros(num_tokens * top_k, hidden)
    for b in range(total // block_size):
        rows = torch.tensor(sorted_ids[b * block_size : (b + 1) * block_size])
        rows = rows[rows < ids.numel()]
        routed[rows] = x[rows // top_k] @ experts[blocks[b]].T * weights.flatten()[rows, None]
    out = torch.empty(num_tokens, hidden)
    torch.ops._moe_C.moe_sum(routed.view(num_tokens, top_k, hidden), out)

    dense = torch.stack(
        [
            sum(weights[t, j] * (experts[ids[t, j]] @ x[t]) for j in range(top_k))
            for t in range(num_tokens)
        ]
    )
    assert torch.allclose(out, dense, atol=1e-5)


# --------------------------------------------------------------------------- MLA cache
@pytest.mark.parametrize(("num_tokens", "num_blocks", "block_size"), [(1, 4, 16), (37, 9, 16)])
def test_concat_and_cache_mla_writes_each_slot(
    standins: types.ModuleType, num_tokens: int, num_blocks: int, block_size: int
) -> None:
    rank, rope = 512, 64
    gen = torch.Generator().manual_seed(num_tokens)
    kv_c = torch.randn(num_tokens, rank, generator=gen).to(torch.bfloat16)
    k_pe = torch.randn(num_tokens, rope, generator=gen).to(torch.bfloat16)
    # block 0 is vLLM's null block: real slots start at block 1; every third token is padding
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_tokens] + block_size
    slots[::3] = -1
    cache = torch.randn(num_blocks, block_size, rank + rope, generator=gen).to(torch.bfloat16)
    want = cache.clone()
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want[slot // block_size, slot % block_size, :rank] = kv_c[i]
            want[slot // block_size, slot % block_size, rank:] = k_pe[i]
    torch.ops._C_cache_ops.concat_and_cache_mla(
        kv_c, k_pe, cache, slots, "auto", torch.ones(()), False
    )
    assert torch.equal(cache, want)


# --------------------------------------------------------------------------- capture safety
def test_stand_ins_run_on_fake_tensors(standins: types.ModuleType) -> None:
    """No data-dependent output shape, no .item(): what CUDA-graph capture also forbids."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    num_tokens, top_k, num_experts, block_size = 12, 4, 32, 16
    capacity = capacity_for(num_tokens * top_k, num_experts, block_size)
    with FakeTensorMode():
        logits = torch.randn(num_tokens, num_experts)
        weights = torch.empty(num_tokens, top_k)
        ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
        sources = torch.empty(num_tokens, top_k, dtype=torch.int32)
        padding = torch.zeros(num_tokens, dtype=torch.bool)
        standins.topk_softmax(weights, ids, sources, logits, True, None, padding)
        standins.topk_sigmoid(weights, ids, sources, logits, True, None, 1.0, padding)
        sorted_ids = torch.empty(capacity, dtype=torch.int32)
        blocks = torch.empty(-(-capacity // block_size), dtype=torch.int32)
        total = torch.empty(1, dtype=torch.int32)
        standins.moe_align_block_size(ids, num_experts, block_size, sorted_ids, blocks, total, None)
        out = torch.empty(num_tokens, 64)
        standins.moe_sum(torch.randn(num_tokens, top_k, 64), out)
        cache = torch.empty(4, 16, 576)
        standins.concat_and_cache_mla(
            torch.randn(num_tokens, 512),
            torch.randn(num_tokens, 64),
            cache,
            torch.zeros(num_tokens, dtype=torch.long),
            "auto",
            torch.ones(()),
        )


def test_register_again_keeps_the_kernels(standins: types.ModuleType) -> None:
    """A second call defines and implements nothing twice (torch would refuse a second kernel)."""
    assert standins.register(("CPU",)) == [f"{ns}::{name}" for ns, name in standins.IMPLS] + [
        f"{ns}::{name} (replaced)" for ns, name in standins.OVERRIDES
    ]
    out = torch.empty(2, 3)
    torch.ops._moe_C.moe_sum(torch.ones(2, 4, 3), out)
    assert out.tolist() == [[4.0] * 3] * 2


# --------------------------------------------------------------------------- vLLM's wrappers
@pytest.mark.vllm
def test_vllm_fused_topk_calls_the_stand_in(vllm_ops: Any) -> None:
    from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk

    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(9, 16, generator=gen)
    logits = torch.randn(9, 128, generator=gen)
    weights, ids, sources = fused_topk(hidden, logits, 8, renormalize=True)
    scores = [[float(v) for v in torch.softmax(row, -1)] for row in logits]
    want_w, want_ids = ref_route(scores, 8, True, None, 1.0, None)
    assert ids.dtype == torch.int32 and ids.tolist() == want_ids
    assert torch.allclose(weights, torch.tensor(want_w), atol=1e-6)
    assert sources.shape == (9, 8)


@pytest.mark.vllm
@pytest.mark.parametrize("pad_sorted_ids", [False, True])
def test_vllm_moe_align_block_size_wrapper(vllm_ops: Any, pad_sorted_ids: bool) -> None:
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

    topk_ids = random_routes(100, 8, 128, seed=11)
    sorted_ids, block_experts, total = moe_align_block_size(
        topk_ids, 64, 128, pad_sorted_ids=pad_sorted_ids
    )
    want_ids, want_blocks, want_total = ref_align(
        topk_ids.flatten().tolist(), 128, 64, sorted_ids.numel(), None
    )
    assert sorted_ids.tolist() == want_ids
    assert block_experts.tolist() == want_blocks
    assert total.tolist() == [want_total]


@pytest.mark.vllm
def test_vllm_sum_and_cache_wrappers(vllm_ops: Any) -> None:
    values = torch.randn(6, 3, 32)
    out = torch.empty(6, 32)
    vllm_ops.moe_sum(values, out)
    assert torch.allclose(out, values[:, 0] + values[:, 1] + values[:, 2], atol=1e-5)

    kv_c, k_pe = torch.randn(2, 512), torch.randn(2, 1, 64)
    cache = torch.zeros(3, 16, 576)
    vllm_ops.concat_and_cache_mla(
        kv_c, k_pe.squeeze(1), cache, torch.tensor([17, -1]), "auto", torch.ones(())
    )
    assert torch.equal(cache[1, 1], torch.cat([kv_c[0], k_pe[0, 0]]))
    assert int(torch.count_nonzero(cache.abs().sum(-1))) == 1


# --------------------------------------------------------------------------- FlashAttention-2
def ref_varlen(
    q: Any, k: Any, v: Any, lengths_q: list[int], lengths_k: list[int], scale: float, causal: bool
) -> tuple[list[list[list[float]]], list[list[float]]]:
    """Row by row, head by head, in plain Python: out[t][h] and lse[h][t].

    flash_attn_interface.py's docstring: k, v with fewer heads serve heads in groups (head h
    reads kv head h // (heads / kv_heads)); a causal mask is aligned to the bottom-right corner
    (query i of a sequence sees keys j <= i + len_k - len_q); a row that sees no key is zero.
    """
    import math

    heads, kv_heads = q.shape[1], k.shape[1]
    out = [[[0.0] * v.shape[2] for _ in range(heads)] for _ in range(q.shape[0])]
    lse = [[float("-inf")] * q.shape[0] for _ in range(heads)]
    q0 = k0 = 0
    for len_q, len_k in zip(lengths_q, lengths_k, strict=True):
        for i in range(len_q):
            for h in range(heads):
                kh = h // (heads // kv_heads)
                seen = [j for j in range(len_k) if not causal or j <= i + len_k - len_q]
                if not seen:
                    continue
                logits = [
                    scale
                    * sum(
                        a * b
                        for a, b in zip(q[q0 + i, h].tolist(), k[k0 + j, kh].tolist(), strict=True)
                    )
                    for j in seen
                ]
                top = max(logits)
                total = sum(math.exp(x - top) for x in logits)
                lse[h][q0 + i] = top + math.log(total)
                for j, x in zip(seen, logits, strict=True):
                    weight = math.exp(x - top) / total
                    row = v[k0 + j, kh].tolist()
                    out[q0 + i][h] = [
                        o + weight * r for o, r in zip(out[q0 + i][h], row, strict=True)
                    ]
        q0, k0 = q0 + len_q, k0 + len_k
    return out, lse


def varlen_args(causal: bool, max_q: int, max_k: int, scale: float) -> tuple[Any, ...]:
    """varlen_fwd's arguments after cu_seqlens_k, as vLLM's flash_attn_varlen_func passes them."""
    return (
        None,
        None,
        None,
        None,
        max_q,
        max_k,
        0.0,
        scale,
        False,
        causal,
        -1,
        -1,
        0.0,
        False,
        0,
        None,
    )


@pytest.mark.parametrize(
    ("lengths_q", "lengths_k", "kv_heads", "causal"),
    [
        ([5, 3], [5, 3], 4, True),  # prefill of new tokens: MLA's run_prefill_new_tokens
        ([3, 2], [7, 4], 2, False),  # a context chunk: unmasked, grouped kv heads
        ([4, 1], [2, 6], 4, True),  # longer queries than keys: leading rows see nothing
    ],
)
def test_varlen_fwd_matches_reference(
    standins: types.ModuleType,
    lengths_q: list[int],
    lengths_k: list[int],
    kv_heads: int,
    causal: bool,
) -> None:
    gen = torch.Generator().manual_seed(sum(lengths_q) * 7 + kv_heads)
    q = torch.randn(sum(lengths_q), 4, 8, generator=gen)
    k = torch.randn(sum(lengths_k), kv_heads, 8, generator=gen)
    v = torch.randn(sum(lengths_k), kv_heads, 8, generator=gen)
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    scale = 8**-0.5
    out = torch.empty_like(q)
    got_out, got_lse = torch.ops._vllm_fa2_C.varlen_fwd(
        q, k, v, out, cu_q, cu_k, *varlen_args(causal, max(lengths_q), max(lengths_k), scale)
    )
    want_out, want_lse = ref_varlen(q, k, v, lengths_q, lengths_k, scale, causal)
    assert got_out.data_ptr() == out.data_ptr()  # written into the caller's `out`
    assert torch.allclose(got_out, torch.tensor(want_out), atol=1e-5)
    assert got_lse.shape == (4, sum(lengths_q)) and got_lse.dtype == torch.float32
    assert torch.allclose(got_lse, torch.tensor(want_lse), atol=1e-5)


def test_varlen_fwd_refuses_what_mla_prefill_never_uses(standins: types.ModuleType) -> None:
    q = torch.randn(3, 2, 8)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    args = list(varlen_args(True, 3, 3, 1.0))
    args[0] = torch.tensor([3], dtype=torch.int32)  # seqused_k
    args[12] = 30.0  # softcap
    with pytest.raises(NotImplementedError, match="seqused_k, softcap"):
        torch.ops._vllm_fa2_C.varlen_fwd(q, q, q, None, cu, cu, *args)


def test_varlen_fwd_fake_kernel_gives_the_output_shapes(standins: types.ModuleType) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.randn(10, 16, 192, dtype=torch.bfloat16)
        cu = torch.tensor([0, 4, 10], dtype=torch.int32)
        out, lse = torch.ops._vllm_fa2_C.varlen_fwd(
            q, q, q, None, cu, cu, *varlen_args(True, 6, 6, 0.1)
        )
    assert out.shape == (10, 16, 192) and out.dtype == torch.bfloat16
    assert lse.shape == (16, 10) and lse.dtype == torch.float32


def test_provide_flash_attn_v2_turns_an_imported_interface_on(
    standins: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM imported its flash_attn_interface first and found FA2 missing: availability flips."""
    import sys

    interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
    interface.FA2_AVAILABLE = False  # type: ignore[attr-defined]
    interface.FA2_UNAVAILABLE_REASON = "no _vllm_fa2_C"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, interface.__name__, interface)
    monkeypatch.delitem(sys.modules, "vllm.vllm_flash_attn._vllm_fa2_C", raising=False)
    standins.provide_flash_attn_v2()
    assert interface.FA2_AVAILABLE is True  # type: ignore[attr-defined]
    assert interface.FA2_UNAVAILABLE_REASON is None  # type: ignore[attr-defined]


@pytest.mark.vllm
def test_vllm_flash_attn_varlen_func_reaches_the_stand_in(
    vllm_ops: Any, standins: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own package imports with FA2 provided (its __init__ refuses to import without FA2
    or FA3), and its wrapper, as the FLASH_ATTN MLA prefill backend calls it with FA2, reaches
    the stand-in."""
    import importlib
    import sys

    for module in [m for m in sys.modules if m.startswith("vllm.vllm_flash_attn")]:
        monkeypatch.delitem(sys.modules, module)  # a fresh import; restored afterwards
    name = standins.provide_flash_attn_v2()
    assert name == "vllm.vllm_flash_attn._vllm_fa2_C"
    monkeypatch.setitem(sys.modules, name, sys.modules[name])  # removed again afterwards
    interface = importlib.import_module("vllm.vllm_flash_attn.flash_attn_interface")
    assert interface.FA2_AVAILABLE and interface.FA2_UNAVAILABLE_REASON is None
    importlib.import_module("vllm.vllm_flash_attn")  # does not raise

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(7, 2, 12, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    out, lse = interface.flash_attn_varlen_func(
        q,
        k,
        v,
        max_seqlen_q=4,
        cu_seqlens_q=cu,
        max_seqlen_k=4,
        cu_seqlens_k=cu,
        softmax_scale=0.3,
        causal=True,
        return_softmax_lse=True,
        fa_version=2,
    )
    want_out, want_lse = ref_varlen(q, k, v, [3, 4], [3, 4], 0.3, True)
    assert torch.allclose(out, torch.tensor(want_out), atol=1e-5)
    assert torch.allclose(lse, torch.tensor(want_lse), atol=1e-5)


# --------------------------------------------------------------------------- MLA context
def test_gather_and_maybe_dequant_cache_reads_each_context_token(
    standins: types.ModuleType,
) -> None:
    """Sequence b's context token p lives at block_table[b][p // block_size], slot p % block_size
    (offset by seq_starts[b] when given); rows past num_tokens stay untouched."""
    gen = torch.Generator().manual_seed(5)
    block_size, entry = 4, 6
    cache = torch.randn(10, block_size, entry, generator=gen)
    block_table = torch.tensor([[7, 2, 9, 0], [3, 5, 1, 8]], dtype=torch.int32)
    lengths, starts = [6, 5], [0, 3]
    cu = torch.tensor([0, 6, 11], dtype=torch.int32)
    token_to_seq = torch.tensor([0] * 6 + [1] * 5 + [0, 0], dtype=torch.int32)
    for seq_starts in (None, torch.tensor(starts, dtype=torch.int32)):
        dst = torch.full((13, entry), -7.0)
        torch.ops._C_cache_ops.gather_and_maybe_dequant_cache(
            cache, dst, block_table, cu, token_to_seq, 11, "auto", torch.ones(()), seq_starts
        )
        want = []
        for b, length in enumerate(lengths):
            offset = starts[b] if seq_starts is not None else 0
            for p in range(offset, offset + length):
                block = int(block_table[b, p // block_size])
                want.append(cache[block, p % block_size].tolist())
        assert dst[:11].tolist() == want
        assert dst[11:].eq(-7.0).all()


def test_gather_and_maybe_dequant_cache_on_a_strided_cache(standins: types.ModuleType) -> None:
    """A cache that is a strided view of a wider buffer is gathered without flattening it."""
    wide = torch.randn(5, 4, 10)
    cache = wide[:, :, :6]
    dst = torch.empty(3, 6)
    standins.gather_and_maybe_dequant_cache(
        cache,
        dst,
        torch.tensor([[4, 1]], dtype=torch.int32),
        torch.tensor([0, 3], dtype=torch.int32),
        torch.zeros(3, dtype=torch.int32),
        3,
        "auto",
        torch.ones(()),
        torch.tensor([3], dtype=torch.int32),
    )
    assert torch.equal(dst, torch.stack([cache[4, 3], cache[1, 0], cache[1, 1]]))


def test_merge_attn_states_matches_the_log_sum_exp_merge(standins: types.ModuleType) -> None:
    """Written per token and head from the docstring's formula; +inf counts as an empty part."""
    import math

    gen = torch.Generator().manual_seed(9)
    tokens, heads, d, with_context = 5, 2, 4, 3
    prefix, suffix = (
        torch.randn(tokens, heads, d, generator=gen),
        torch.randn(tokens, heads, d, generator=gen),
    )
    lp, ls = torch.randn(heads, tokens, generator=gen), torch.randn(heads, tokens, generator=gen)
    lp[0, 1] = float("inf")  # an empty prefix
    lp[1, 2], ls[1, 2] = float("-inf"), float("-inf")  # both empty
    out, out_lse = torch.empty_like(prefix), torch.empty(heads, tokens)
    torch.ops._C.merge_attn_states(out, out_lse, prefix, lp, suffix, ls, with_context, None)
    for t in range(tokens):
        for h in range(heads):
            if t >= with_context:
                assert out[t, h].tolist() == suffix[t, h].tolist()
                assert out_lse[h, t].item() == ls[h, t].item()
                continue
            a = -math.inf if lp[h, t].item() == math.inf else lp[h, t].item()
            b = -math.inf if ls[h, t].item() == math.inf else ls[h, t].item()
            if a == b == -math.inf:
                assert out[t, h].abs().sum().item() == 0.0 and out_lse[h, t].item() == -math.inf
                continue
            top = max(a, b)
            wa, wb = math.exp(a - top), math.exp(b - top)
            want = [
                (wa * x + wb * y) / (wa + wb)
                for x, y in zip(prefix[t, h].tolist(), suffix[t, h].tolist(), strict=True)
            ]
            assert out[t, h].tolist() == pytest.approx(want, abs=1e-5)
            assert out_lse[h, t].item() == pytest.approx(top + math.log(wa + wb), abs=1e-5)


@pytest.mark.vllm
def test_vllm_merge_attn_states_reaches_the_stand_in(vllm_ops: Any) -> None:
    """vLLM's wrapper binds the stand-in's schema (prefill_tokens_with_context None: all)."""
    prefix, suffix = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    lse = torch.zeros(2, 3)
    out = torch.empty(3, 2, 8)
    vllm_ops.merge_attn_states(out, prefix, lse, suffix, lse)
    assert torch.allclose(out, (prefix + suffix) / 2, atol=1e-6)


# --------------------------------------------------------------------------- DeepSeek-V3's A-GEMM
def ref_matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """out[i][j] = sum_k a[i][k] * b[k][j], one product at a time."""
    return [
        [sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]
        for i in range(len(a))
    ]


def small_integers(shape: tuple[int, ...], seed: int) -> Any:
    """BF16 integers in [-3, 3]: products and sums of 48 of them stay exact in BF16's 8 bits."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=gen).to(torch.bfloat16)


@pytest.mark.parametrize("tokens", [1, 5, 16])
def test_dsv3_fused_a_gemm_is_the_matmul(standins: types.ModuleType, tokens: int) -> None:
    # |sum| <= 48 * 9 = 432 < 512: every partial sum is an integer BF16 holds exactly
    x = small_integers((tokens, 48), 1)
    weight = small_integers((24, 48), 2)  # [N, K] like the fused q/kv A weight
    out = torch.full((tokens, 24), 99.0, dtype=torch.bfloat16)
    torch.ops._C.dsv3_fused_a_gemm(out, x, weight.t(), False)
    want = ref_matmul(x.float().tolist(), weight.t().float().tolist())
    assert out.float().tolist() == want and out.dtype == torch.bfloat16


@pytest.mark.vllm
def test_vllm_dsv3_fused_a_gemm_wrapper_reaches_the_stand_in(vllm_ops: Any) -> None:
    """vLLM's caller (_min_latency_fused_qkv_a_proj_impl) passes weight.T, column-major."""
    x = small_integers((3, 32), 3)
    weight = small_integers((8, 32), 4)
    out = torch.empty(3, 8, dtype=torch.bfloat16)
    vllm_ops.dsv3_fused_a_gemm(out, x, weight.T)
    assert out.float().tolist() == ref_matmul(x.float().tolist(), weight.T.float().tolist())


# --------------------------------------------------------------------------- grouped rms_norm
def ref_rms(row: list[float], weight: list[float], eps: float) -> list[float]:
    """x / sqrt(mean(x^2) + eps) * w, in Python floats."""
    scale = 1.0 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
    return [v * scale * w for v, w in zip(row, weight, strict=True)]


def test_grouped_rms_norm_applies_weight_g_to_x_g(standins: types.ModuleType) -> None:
    gen = torch.Generator().manual_seed(9)
    groups, tokens, hidden, eps = 3, 4, 16, 1e-6
    x = torch.randn(groups, tokens, hidden, generator=gen)
    weight = torch.randn(groups, hidden, generator=gen)
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, eps)
    for g in range(groups):
        for t in range(tokens):
            want = ref_rms(x[g, t].tolist(), weight[g].tolist(), eps)
            assert out[g, t].tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)
    # a [G, H] weight over a 4-D x [G, B, T, H]: still x[g] with weight[g]
    x4 = torch.randn(groups, 2, 3, hidden, generator=gen)
    out4 = torch.empty_like(x4)
    torch.ops._C.rms_norm(out4, x4, weight, eps)
    want4 = ref_rms(x4[2, 1, 0].tolist(), weight[2].tolist(), eps)
    assert out4[2, 1, 0].tolist() == pytest.approx(want4, rel=1e-5, abs=1e-6)


def _shim_rms() -> Any:
    """The shim's own `_rms`, taken from its source alone (importing the shim registers ops)."""
    import ast
    from pathlib import Path

    path = Path("/work/shared/vllm-h200/vllm_c_shim.py")
    if not path.exists():
        pytest.skip("the vLLM shim is not on this machine")
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_rms")
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["_rms"]


@pytest.mark.parametrize("with_weight", [True, False])
def test_plain_rms_norm_matches_the_shims_arithmetic(
    standins: types.ModuleType, with_weight: bool
) -> None:
    """A [H] weight (or none): bit for bit the shim's kernel, which the override replaces."""
    shim_rms = _shim_rms()
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    weight = torch.randn(64, generator=gen).to(torch.bfloat16) if with_weight else None
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, 1e-6)
    assert torch.equal(out, shim_rms(x, weight, 1e-6))
    row = ref_rms(
        x[0].float().tolist(), (weight if with_weight else torch.ones(64)).float().tolist(), 1e-6
    )
    assert out[0].float().tolist() == pytest.approx(row, rel=2e-2, abs=1e-2)  # BF16 rounding


# --------------------------------------------------------------------------- silu_and_mul
def test_silu_and_mul_writes_the_gated_activation_in_place(standins: types.ModuleType) -> None:
    """silu(gate) x up, as vLLM's kernel defines it, into the result's own storage: the CUDA
    kernel allocates nothing, so neither may the stand-in (the shim's made two temporaries)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 2 * 8, generator=gen)
    out = torch.empty(6, 8)
    storage = out.data_ptr()
    torch.ops._C.silu_and_mul(out, x)
    gate, up = x[:, :8], x[:, 8:]
    by_hand = [
        [g / (1 + math.exp(-g)) * u for g, u in zip(gr, ur, strict=True)]
        for gr, ur in zip(gate.tolist(), up.tolist(), strict=True)
    ]
    assert out.data_ptr() == storage
    for row, ref in zip(out.tolist(), by_hand, strict=True):
        assert row == pytest.approx(ref, rel=1e-5, abs=1e-6)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    result, x = torch.empty(4, 8), torch.randn(4, 16)
    with Ops() as ops:
        standins.silu_and_mul(result, x)
    # views and in-place kernels only: no op that makes a tensor of its own
    assert {n.split(".")[0] for n in ops.names} <= {"slice", "copy_", "silu_", "mul_"}

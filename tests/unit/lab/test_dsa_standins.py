"""The DSA indexer's torch stand-ins (lab/dsa_standins.py) on CPU.

Expected values are worked out by hand (FP8-exact numbers: powers of two) or come from
references written here with plain loops from vLLM 0.33.0's semantics: the cache layout of
csrc/cache_kernels.cu (values of a block, then its scales), DeepGEMM's MQA-logits formula as
vLLM's torch fallbacks state it (`fp8_mqa_logits_torch`, `fp8_paged_mqa_logits_torch` in
v1/attention/ops/rocm_aiter_mla_sparse.py), and the top-k contract of
model_executor/layers/indexer_topk.py (-1 past a row's length). A fake-tensor run stands in
for the CUDA-graph check: a data-dependent shape or a host read fails there.
"""

from __future__ import annotations

import importlib.util
import math
import types
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_or_skip

torch = pytest.importorskip("torch")

STANDINS = Path(__file__).resolve().parents[3] / "lab" / "dsa_standins.py"
FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def dsa() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("dsa_standins", STANDINS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.register_ops(("CPU",))
    return module


def empty_cache(blocks: int, block_size: int, head_dim: int) -> torch.Tensor:
    """vLLM's indexer cache: uint8 [blocks, block_size, head_dim + head_dim / 128 * 4]."""
    return torch.zeros(blocks, block_size, head_dim + head_dim // 128 * 4, dtype=torch.uint8)


def byte_value(cache: torch.Tensor, block: int, slot: int, i: int, head_dim: int) -> float:
    """Value i of a slot, read by byte offset: values first in the block, slot-major."""
    flat = cache[block].reshape(-1)
    return float(flat[slot * head_dim + i : slot * head_dim + i + 1].view(FP8).float())


def byte_scale(cache: torch.Tensor, block: int, slot: int, head_dim: int) -> float:
    flat = cache[block].reshape(-1)
    start = cache.shape[1] * head_dim + slot * 4
    return float(flat[start : start + 4].view(torch.float32))


# --------------------------------------------------------------------------- cache ops
def test_quant_and_cache_writes_values_and_ue8m0_scale_at_the_slot(dsa: types.ModuleType) -> None:
    """k = (1, -2, 0.5, 0...): amax 2, scale 2/448 rounded up to 2^-7, values 128, -256, 64."""
    head_dim, block_size = 128, 4
    cache = empty_cache(3, block_size, head_dim)
    k = torch.zeros(2, head_dim, dtype=torch.bfloat16)
    k[0, :3] = torch.tensor([1.0, -2.0, 0.5])
    k[1, :] = 7.0  # a padding row: slot -1 writes nothing
    slots = torch.tensor([6, -1])  # block 1, slot 2
    torch.ops._C_cache_ops.indexer_k_quant_and_cache(k, cache, slots, 128, "ue8m0")
    assert byte_scale(cache, 1, 2, head_dim) == 2.0**-7
    assert [byte_value(cache, 1, 2, i, head_dim) for i in range(4)] == [128.0, -256.0, 64.0, 0.0]
    written = cache.clone()
    written[1, :] = 0
    assert int(written.count_nonzero()) == 0  # nothing outside block 1
    assert int(cache[1].count_nonzero()) == 3 + 1  # three values; 2^-7 is 0x3C000000: one byte


def test_quant_and_cache_plain_scale_is_amax_over_448(dsa: types.ModuleType) -> None:
    cache = empty_cache(1, 2, 128)
    k = torch.full((1, 128), 224.0)
    torch.ops._C_cache_ops.indexer_k_quant_and_cache(k, cache, torch.tensor([1]), 128, "")
    assert byte_scale(cache, 0, 1, 128) == pytest.approx(0.5)
    assert byte_value(cache, 0, 1, 0, 128) == 448.0


def test_gather_reads_each_sequence_through_its_block_table(dsa: types.ModuleType) -> None:
    head_dim, block_size = 128, 2
    cache = empty_cache(4, block_size, head_dim)
    values, scales = dsa.cache_regions(cache, head_dim)
    for block in range(4):  # value 0 of (block, slot) = 10 * block + slot; scale = same + 0.5
        for slot in range(block_size):
            values[block, slot, 0] = 10 * block + slot
            scales[block, slot, 0] = 10 * block + slot + 0.5
    # sequence 0: 3 tokens in blocks 2 then 0; sequence 1: 1 token in block 3
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    dst_k = torch.full((6, head_dim), 99, dtype=torch.uint8).view(FP8)
    dst_scale = torch.zeros(6, 4, dtype=torch.uint8)
    torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache(cache, dst_k, dst_scale, table, cu)
    got = dst_k.view(torch.uint8)[:, 0].tolist()
    assert got == [20, 21, 0, 30, 99, 99]  # (2,0) (2,1) (0,0) (3,0); rows past the batch kept
    assert dst_scale.view(torch.float32)[:4, 0].tolist() == [20.5, 21.5, 0.5, 30.5]


# --------------------------------------------------------------------------- top-k
def test_prefill_topk_is_relative_to_the_row_start_and_pads_with_minus_one(
    dsa: types.ModuleType,
) -> None:
    logits = torch.tensor(
        [
            [5.0, 1.0, 9.0, 3.0, 7.0, 0.0],  # window [1, 5): columns 1..4, best 2, 4, 3
            [2.0, 8.0, 0.0, 0.0, 0.0, 0.0],  # window [0, 2): shorter than k
        ]
    )
    out = torch.zeros(2, 3, dtype=torch.int32)
    starts = torch.tensor([1, 0], dtype=torch.int32)
    ends = torch.tensor([5, 2], dtype=torch.int32)
    torch.ops._C.top_k_per_row_prefill(logits, starts, ends, out, 2, 6, 1, 3)
    assert sorted(out[0].tolist()) == [1, 2, 3]  # columns 2, 3, 4 less the start 1
    assert sorted(out[1].tolist()) == [-1, 0, 1]


def test_decode_topk_row_lengths_from_seq_lens_and_next_n(dsa: types.ModuleType) -> None:
    """One request, context 3, next_n 2: rows see 2 and 3 columns (seq_len - next_n + j + 1)."""
    logits = torch.tensor([[1.0, 4.0, 9.0, 9.0], [1.0, 4.0, 9.0, 9.0]])
    out = torch.zeros(2, 2, dtype=torch.int32)
    seq_lens = torch.tensor([3], dtype=torch.int32)
    torch.ops._C.top_k_per_row_decode(logits, 2, seq_lens, out, 2, 4, 1, 2)
    assert sorted(out[0].tolist()) == [0, 1]
    assert sorted(out[1].tolist()) == [1, 2]
    # 2-D seq_lens [B, next_n] are the rows' own lengths
    out2 = torch.zeros(2, 2, dtype=torch.int32)
    seq2 = torch.tensor([[1, 4]], dtype=torch.int32)
    torch.ops._C.top_k_per_row_decode(logits, 2, seq2, out2, 2, 4, 1, 2)
    assert sorted(out2[0].tolist()) == [-1, 0]
    assert sorted(out2[1].tolist()) == [2, 3]


# --------------------------------------------------------------------------- logits
def _dense_reference(
    q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """score[m][n] = sum_h relu(q[m,h] . k[n] * scale[n]) * w[m,h], by loops."""
    out = torch.zeros(q.shape[0], k.shape[0])
    for m in range(q.shape[0]):
        for n in range(k.shape[0]):
            for h in range(q.shape[1]):
                dot = float((q[m, h].float() * k[n].float()).sum()) * float(k_scale[n])
                out[m, n] += max(dot, 0.0) * float(weights[m, h])
    return out


def test_mqa_logits_by_hand(dsa: types.ModuleType) -> None:
    """M=1, H=2, D=2, N=2: q = ((1, 0), (0, 1)), k = ((2, 0), (-1, 4)), scales 0.5 and 2,
    weights (1, 3): column 0 = relu(1) * 1 + relu(0) * 3 = 1; column 1 = relu(-2) + relu(8) * 3 = 24.
    """
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]).to(FP8)
    k = torch.tensor([[2.0, 0.0], [-1.0, 4.0]]).to(FP8)
    scale = torch.tensor([0.5, 2.0])
    weights = torch.tensor([[1.0, 3.0]])
    ks, ke = torch.tensor([0], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    logits = dsa.fp8_fp4_mqa_logits((q, None), (k, scale), weights, ks, ke, 2)
    assert logits.dtype == torch.float32 and logits.shape == (1, 2)
    assert logits.tolist() == [[1.0, 24.0]]


def test_mqa_logits_are_compressed_rows(dsa: types.ModuleType) -> None:
    """Row i holds positions [ks[i], ke[i]) from column 0; width max_seqlen_k; bf16 on request."""
    gen = torch.Generator().manual_seed(0)
    m, h, d, n = 5, 3, 8, 9
    q = (torch.randint(-4, 5, (m, h, d), generator=gen) / 2).to(FP8)
    k = (torch.randint(-4, 5, (n, d), generator=gen) / 2).to(FP8)
    scale = torch.tensor([2.0**-i for i in range(n)])
    weights = torch.rand(m, h, generator=gen)
    ks = torch.tensor([0, 0, 4, 4, 4], dtype=torch.int32)  # two requests of 4 and 5 keys
    ke = torch.tensor([3, 4, 7, 8, 9], dtype=torch.int32)
    ref = _dense_reference(q, k, scale, weights)
    logits = dsa.fp8_fp4_mqa_logits((q, None), (k, scale), weights, ks, ke, 5)
    assert logits.shape == (m, 5) and logits.dtype == torch.float32
    for i in range(m):
        width = int(ke[i] - ks[i])
        torch.testing.assert_close(logits[i, :width], ref[i, int(ks[i]) : int(ke[i])])
    half = dsa.fp8_fp4_mqa_logits((q, None), (k, scale), weights, ks, ke, 5, torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.shape == (m, 5)


def _fill_cache(
    dsa: types.ModuleType, blocks: int, block_size: int, head_dim: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cache = empty_cache(blocks, block_size, head_dim)
    values, scales = dsa.cache_regions(cache, head_dim)
    keys = (torch.randint(-4, 5, (blocks, block_size, head_dim), generator=gen) / 4).to(FP8)
    values.copy_(keys.view(torch.uint8))
    scale = 2.0 ** torch.randint(-3, 2, (blocks, block_size), generator=gen).float()
    scales[..., 0] = scale
    return cache, keys, scale


def test_paged_mqa_logits_against_a_loop_over_positions(dsa: types.ModuleType) -> None:
    gen = torch.Generator().manual_seed(1)
    head_dim, block_size, heads, next_n, batch, max_len = 128, 4, 2, 2, 3, 12
    cache, keys, scale = _fill_cache(dsa, 8, block_size, head_dim, gen)
    q = (torch.randint(-4, 5, (batch, next_n, heads, head_dim), generator=gen) / 4).to(FP8)
    weights = torch.rand(batch * next_n, heads, generator=gen)
    table = torch.tensor([[7, 1, 3], [2, 0, 5], [6, 4, 1]], dtype=torch.int32)
    context = torch.tensor([[5], [12], [2]], dtype=torch.int32)
    logits = dsa.fp8_fp4_paged_mqa_logits(
        (q, None), cache.unsqueeze(-2), weights, context, table, torch.zeros(2, 2), max_len
    )
    assert logits.shape == (batch * next_n, max_len) and logits.dtype == torch.float32
    for b in range(batch):
        pos_keys = torch.stack(
            [keys[table[b, c // block_size], c % block_size] for c in range(max_len)]
        )
        pos_scale = torch.stack(
            [scale[table[b, c // block_size], c % block_size] for c in range(max_len)]
        )
        rows = weights[b * next_n : (b + 1) * next_n]
        ref = _dense_reference(q[b], pos_keys, pos_scale, rows)
        seen = int(context[b, 0])
        torch.testing.assert_close(logits[b * next_n : (b + 1) * next_n, :seen], ref[:, :seen])


def test_paged_logits_allocate_only_the_output_after_the_first_call(dsa: types.ModuleType) -> None:
    """Scratch buffers are made once; a second call with the same shapes adds none."""
    gen = torch.Generator().manual_seed(2)
    cache, _, _ = _fill_cache(dsa, 4, 4, 128, gen)
    q = torch.zeros(2, 1, 2, 128).to(FP8)
    args = (torch.ones(2, 2), torch.tensor([[4], [4]]), torch.tensor([[0, 1], [2, 3]]), None)
    dsa.fp8_fp4_paged_mqa_logits((q, None), cache.unsqueeze(-2), *args[:3], args[3], 8)
    before = len(dsa._SCRATCH)
    out = dsa.fp8_fp4_paged_mqa_logits((q, None), cache.unsqueeze(-2), *args[:3], args[3], 8)
    assert len(dsa._SCRATCH) == before and out.shape == (2, 8)


def test_schedule_metadata_shape(dsa: types.ModuleType) -> None:
    meta = dsa.get_paged_mqa_logits_metadata(torch.ones(4, 1, dtype=torch.int32), 64, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32


# --------------------------------------------------------------------------- capture safety
def test_stand_ins_run_on_fake_tensors(
    dsa: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No data-dependent output shape, no .item(): what CUDA-graph capture also forbids."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(dsa, "_SCRATCH", {})  # the scratch of earlier real calls is not fake

    with FakeTensorMode():
        cache = torch.zeros(4, 64, 132, dtype=torch.uint8)
        q = torch.zeros(3, 1, 4, 128).to(FP8)
        seq_lens = torch.ones(3, 1, dtype=torch.int32)
        table = torch.zeros(3, 4, dtype=torch.int32)
        logits = dsa.fp8_fp4_paged_mqa_logits(
            (q, None), cache.unsqueeze(-2), torch.ones(3, 4), seq_lens, table, None, 256
        )
        topk = torch.zeros(3, 8, dtype=torch.int32)
        dsa.top_k_per_row_decode(logits, 1, seq_lens, topk, 3, 256, 1, 8)
        k = torch.zeros(3, 128, dtype=torch.bfloat16)
        dsa.indexer_k_quant_and_cache(k, cache, torch.zeros(3, dtype=torch.long), 128, "ue8m0")
        dst = torch.zeros(5, 128, dtype=torch.uint8)
        scale = torch.zeros(5, 4, dtype=torch.uint8)
        cu = torch.tensor([0, 5], dtype=torch.int32)
        dsa.cp_gather_indexer_k_quant_cache(cache, dst, scale, table[:1], cu)
    assert logits.shape == (3, 256) and logits.dtype == torch.float32


# --------------------------------------------------------------------------- sparse MLA
def _sparse_mla_loop(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    d_v: int,
    lengths: list[int] | None,
) -> tuple[list[list[list[float]]], list[list[float]]]:
    """FlashMLA-sparse's attend, one query token and head at a time with plain Python sums."""
    out: list[list[list[float]]] = []
    lse: list[list[float]] = []
    for i in range(q.shape[0]):
        chosen = [
            int(j)
            for n, j in enumerate(indices[i, 0].tolist())
            if 0 <= j < kv.shape[0] and (lengths is None or n < lengths[i])
        ]
        rows, sums = [], []
        for h in range(q.shape[1]):
            qh = q[i, h].float().tolist()
            logits = [
                scale * sum(a * b for a, b in zip(qh, kv[j, 0].float().tolist(), strict=True))
                for j in chosen
            ]
            top = max(logits, default=0.0)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            rows.append(
                [
                    sum(w * float(kv[j, 0, c]) for w, j in zip(weights, chosen, strict=True))
                    / total
                    if total
                    else 0.0
                    for c in range(d_v)
                ]
            )
            sums.append(math.log(total) + top if total else -math.inf)
        out.append(rows)
        lse.append(sums)
    return out, lse


def test_sparse_mla_attends_only_to_the_valid_selected_keys(dsa: types.ModuleType) -> None:
    gen = torch.Generator().manual_seed(5)
    s_q, h_q, d_qk, d_v, s_kv = 3, 2, 8, 4, 6
    q = torch.randn(s_q, h_q, d_qk, generator=gen).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, generator=gen).to(torch.bfloat16)
    # token 0: keys 4, 1 (-1 masked); token 1: 0, 5, 2 and 9 >= s_kv masked; token 2: none valid
    indices = torch.tensor([[[4, -1, 1, -1]], [[0, 5, 9, 2]], [[-1, -1, 7, -1]]], dtype=torch.int32)
    out, max_logits, lse = dsa.flash_mla_sparse_fwd(q, kv, indices, 0.5, d_v=d_v)
    want_out, want_lse = _sparse_mla_loop(q, kv, indices, 0.5, d_v, None)
    assert out.shape == (s_q, h_q, d_v) and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), torch.tensor(want_out), atol=2e-2)
    assert torch.allclose(lse[:2], torch.tensor(want_lse[:2]), atol=1e-4)
    assert torch.isinf(lse[2]).all() and (lse[2] < 0).all()  # no valid key: the empty sum
    assert (out[2] == 0).all() and torch.isinf(max_logits[2]).all()


def test_sparse_mla_topk_length_cuts_each_tokens_keys(dsa: types.ModuleType) -> None:
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(2, 1, 8, generator=gen).to(torch.bfloat16)
    kv = torch.randn(5, 1, 8, generator=gen).to(torch.bfloat16)
    indices = torch.tensor([[[0, 1, 2, 3]], [[4, 3, 2, 1]]], dtype=torch.int32)
    lengths = torch.tensor([1, 3], dtype=torch.int32)
    out, _, lse = dsa.flash_mla_sparse_fwd(q, kv, indices, 1.0, d_v=4, topk_length=lengths)
    want_out, want_lse = _sparse_mla_loop(q, kv, indices, 1.0, 4, [1, 3])
    # token 0 sees key 0 alone: its output is key 0's first 4 values
    assert torch.equal(out[0, 0], kv[0, 0, :4])
    assert torch.allclose(out.float(), torch.tensor(want_out), atol=2e-2)
    assert torch.allclose(lse, torch.tensor(want_lse), atol=1e-4)


def test_sparse_mla_allocates_only_its_outputs_after_the_first_call(
    dsa: types.ModuleType,
) -> None:
    q = torch.zeros(20, 2, 8, dtype=torch.bfloat16)  # two row chunks
    kv = torch.zeros(4, 1, 8, dtype=torch.bfloat16)
    indices = torch.zeros(20, 1, 3, dtype=torch.int32)
    dsa.flash_mla_sparse_fwd(q, kv, indices, 1.0, d_v=4)
    before = len(dsa._SCRATCH)
    out, _, _ = dsa.flash_mla_sparse_fwd(q, kv, indices, 1.0, d_v=4)
    assert len(dsa._SCRATCH) == before and out.shape == (20, 2, 4)


def test_sparse_mla_runs_on_fake_tensors(
    dsa: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(dsa, "_SCRATCH", {})
    with FakeTensorMode():
        q = torch.zeros(17, 64, 576, dtype=torch.bfloat16)
        kv = torch.zeros(32, 1, 576, dtype=torch.bfloat16)
        indices = torch.zeros(17, 1, 16, dtype=torch.int32)
        out, max_logits, lse = dsa.flash_mla_sparse_fwd(
            q, kv, indices, 0.1, topk_length=torch.ones(17, dtype=torch.int32)
        )
    assert (
        out.shape == (17, 64, 512) and lse.shape == (17, 64) and max_logits.dtype == torch.float32
    )


# --------------------------------------------------------------------------- concat_mla_q
def _concat_loop(
    ql_nope: torch.Tensor, q_pe: torch.Tensor, q_out: torch.Tensor
) -> list[list[list[float]]]:
    """vLLM's semantics, value by value: q_out[t, h] = ql_nope[t, h] then q_pe[t, h]; tokens
    and heads past ql_nope's keep what q_out held (the BF16 workspace is head-padded)."""
    want = q_out.float().tolist()
    nope = ql_nope.shape[2]
    for t in range(ql_nope.shape[0]):
        for h in range(ql_nope.shape[1]):
            for c in range(nope):
                want[t][h][c] = float(ql_nope[t, h, c])
            for c in range(q_pe.shape[2]):
                want[t][h][nope + c] = float(q_pe[t, h, c])
    return want


def test_concat_mla_q_joins_nope_and_rope_into_the_padded_buffer(dsa: types.ModuleType) -> None:
    gen = torch.Generator().manual_seed(7)
    tokens, heads, padded_heads = 3, 2, 4
    ql_nope = torch.randn(tokens, heads, 512, generator=gen).to(torch.bfloat16)
    # q_pe a strided view (stride 1 in the last dim), as the rope output sliced from q can be
    q_pe = torch.randn(tokens, heads, 96, generator=gen).to(torch.bfloat16)[..., 16:80]
    buffer = torch.full((5, padded_heads, 576), 7.0, dtype=torch.bfloat16)  # 5 >= tokens rows
    want = _concat_loop(ql_nope, q_pe, buffer)
    torch.ops._C_cache_ops.concat_mla_q(ql_nope, q_pe, buffer)
    assert buffer.float().tolist() == want
    assert (buffer[:, heads:] == 7.0).all() and (buffer[tokens:] == 7.0).all()


def test_concat_mla_q_refuses_what_the_cuda_kernel_refuses(dsa: types.ModuleType) -> None:
    nope = torch.zeros(1, 1, 512, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="rope_dim must be 64"):
        dsa.concat_mla_q(nope, torch.zeros(1, 1, 32), torch.zeros(1, 1, 544))
    with pytest.raises(RuntimeError, match="multiple of 512"):
        dsa.concat_mla_q(nope[..., :256], torch.zeros(1, 1, 64), torch.zeros(1, 1, 320))
    with pytest.raises(RuntimeError, match="nope_dim \\+ rope_dim"):
        dsa.concat_mla_q(nope, torch.zeros(1, 1, 64), torch.zeros(1, 1, 512))


def test_concat_mla_q_only_copies_into_q_out(dsa: types.ModuleType) -> None:
    """The only aten ops are views of q_out and copies into them: nothing is allocated, no
    value is read on the host (what a captured graph needs)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    ql_nope = torch.ones(2, 3, 512, dtype=torch.bfloat16)
    q_pe = torch.ones(2, 3, 64, dtype=torch.bfloat16)
    q_out = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    with Record() as record:
        dsa.concat_mla_q(ql_nope, q_pe, q_out)
    assert record.ops == {"slice", "copy_"}
    assert q_out[:2, :3].eq(1).all() and q_out[2:].eq(0).all() and q_out[:, 3:].eq(0).all()


def test_concat_mla_q_runs_on_fake_tensors(dsa: types.ModuleType) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q_out = torch.empty(8, 64, 576, dtype=torch.bfloat16)
        dsa.concat_mla_q(
            torch.zeros(5, 16, 512, dtype=torch.bfloat16),
            torch.zeros(5, 16, 64, dtype=torch.bfloat16),
            q_out[:5],
        )
    assert q_out.shape == (8, 64, 576)


@pytest.mark.vllm
def test_vllms_concat_mla_q_wrapper_reaches_the_stand_in(dsa: types.ModuleType) -> None:
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        require_or_skip("MEMEST_REQUIRE_VLLM", "vLLM 0.33.0 is not installed")
        raise
    gen = torch.Generator().manual_seed(8)
    ql_nope = torch.randn(2, 3, 512, generator=gen).to(torch.bfloat16)
    q_pe = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    q_out = torch.zeros(2, 64, 576, dtype=torch.bfloat16)  # FlashMLA-sparse's padded buffer
    want = _concat_loop(ql_nope, q_pe, q_out)
    ops.concat_mla_q(ql_nope, q_pe, q_out)
    assert q_out.float().tolist() == want


# --------------------------------------------------------------------------- fused_q on SM90
def _installed_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        require_or_skip("MEMEST_REQUIRE_VLLM", "vLLM 0.33.0 is not installed")
        raise AssertionError("unreachable")
    return Path(next(iter(spec.submodule_search_locations)))


def _real_cutedsl_gate(capability: int) -> Any:
    """vLLM's own `is_fused_q_cutedsl_supported`, compiled from the installed source text alone
    (its module imports `cutlass` at the top), on a platform of the given capability."""
    import ast

    path = _installed_vllm() / "models/deepseek_v32/nvidia/ops/fused_q_cutedsl.py"
    tree = ast.parse(path.read_text())
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "is_fused_q_cutedsl_supported"
    )
    platform = types.SimpleNamespace(has_device_capability=lambda wanted: capability >= wanted)
    namespace: dict[str, Any] = {"torch": torch, "current_platform": platform}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["is_fused_q_cutedsl_supported"]


def _dsa_query_shapes() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V3.2's per-token shapes at fused_q: q_pe [T, 128, 64], index_q [T, 64, 128],
    ql_nope [T, 128, 512], all BF16 (lab/models/dsv32_4l)."""
    return (
        torch.zeros(2, 128, 64, dtype=torch.bfloat16),
        torch.zeros(2, 64, 128, dtype=torch.bfloat16),
        torch.zeros(2, 128, 512, dtype=torch.bfloat16),
    )


def test_vllms_cute_dsl_fused_q_needs_capability_10() -> None:
    """The stand-in module answers what vLLM's gate answers on SM90: no (the gate's first
    condition is has_device_capability(100)); on SM100 the same shapes pass it."""
    q_pe, index_q, ql_nope = _dsa_query_shapes()
    for quantize_mqa in (False, True):
        kwargs = {"has_indexer": True, "quantize_mqa": quantize_mqa}
        assert _real_cutedsl_gate(90)(q_pe, index_q, ql_nope, **kwargs) is False
        assert _real_cutedsl_gate(100)(q_pe, index_q, ql_nope, **kwargs) is True


def test_provided_module_answers_not_supported(
    dsa: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.delitem(sys.modules, dsa.FUSED_Q_CUTEDSL_MODULE, raising=False)
    assert dsa.provide_fused_q_without_cute_dsl() == [
        f"{dsa.FUSED_Q_CUTEDSL_MODULE} (SM90: Triton fused_q)"
    ]
    module = sys.modules[dsa.FUSED_Q_CUTEDSL_MODULE]
    q_pe, index_q, ql_nope = _dsa_query_shapes()
    assert (
        module.is_fused_q_cutedsl_supported(
            q_pe, index_q, ql_nope, has_indexer=True, quantize_mqa=False
        )
        is False
    )
    with pytest.raises(RuntimeError, match="SM100"):
        module.fused_q_cutedsl()


class _LaunchRecorder:
    """Stands for a Triton kernel: `kernel[grid](*args, **kwargs)` records the launch."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, int]] = []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append((grid, len(args)))

        return launch


@pytest.mark.vllm
def test_vllms_fused_q_reaches_its_triton_kernel_with_the_provided_module(
    dsa: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's fused_q on a CUDA platform imports the CuTe DSL module and asks it; with the
    provided module the answer is no and its own Triton kernel is launched (recorded here: no
    GPU), with the grid (tokens, 3, max((heads + 1) // 2, index heads))."""
    import sys

    _installed_vllm()
    kernels = importlib.import_module("vllm.models.deepseek_v32.common.kernels")
    monkeypatch.delitem(sys.modules, dsa.FUSED_Q_CUTEDSL_MODULE, raising=False)
    dsa.provide_fused_q_without_cute_dsl()
    recorder = _LaunchRecorder()
    monkeypatch.setattr(kernels, "_fused_q_kernel", recorder)
    platform = types.SimpleNamespace(is_cuda=lambda: True, is_arch_support_pdl=lambda: False)
    monkeypatch.setattr(kernels, "current_platform", platform)
    # without a GPU vLLM's triton is a placeholder; the launch reads one helper of it
    helpers = types.SimpleNamespace(next_power_of_2=lambda n: 1 << (n - 1).bit_length())
    monkeypatch.setattr(kernels, "triton", helpers)
    q_pe, index_q, ql_nope = _dsa_query_shapes()
    tokens = q_pe.shape[0]
    index_q_fp8, weights_out, mqa_q = kernels.fused_q(
        torch.arange(tokens),
        q_pe,
        torch.zeros(16, 64),
        index_q,
        torch.zeros(16, 64),
        ql_nope,
        torch.ones(1),
        torch.zeros(tokens, 64),
        0.1,
        0.125,
        has_indexer=True,
        quantize_mqa=False,  # FlashMLA-sparse with a BF16 cache: a BF16 query
    )
    assert [grid for grid, _ in recorder.launches] == [(tokens, 3, 64)]
    assert index_q_fp8.dtype == torch.float8_e4m3fn and mqa_q.shape == q_pe.shape
    assert weights_out.dtype == torch.float32

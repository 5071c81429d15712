"""vLLM 0.33.0's DSA indexer with the lab's stand-ins registered, on vLLM's CPU platform.

    VLLM_TARGET_DEVICE=cpu python tests/unit/lab/dsa_vllm_cpu.py

Prints one JSON line per check, run by tests/unit/lab/test_dsa_vllm.py in a subprocess of its own
(vLLM's platform is chosen once per process). First vLLM's own wrappers (vllm/_custom_ops.py,
vllm/utils/deep_gemm.py) are called with small CPU shapes, through the stand-ins
lab/dsa_standins.py registers, and compared with vLLM's own torch references
(v1/attention/ops/rocm_aiter_mla_sparse.py); then DeepseekV32ForCausalLM (lab/models/dsv32_4l)
is built on the meta device as vLLM's loader builds it (tests/unit/preflight/vllm_meta.py).

Two things on the CPU are not vLLM's GPU path: the CPU platform refuses sparse attention ("Sparse
Attention is not supported on CPU.") when it picks the attention backend, so its backend choice
is given FLASHMLA_SPARSE, the one the lab's H200 start names; and FlashMLA's sparse kernels
(`_flashmla_C`, a CUDA extension) are never called: a meta build runs no forward. The CPU
platform's `DeepseekV32ForCausalLM` is the generic DeepseekV3ForCausalLM; meta_build_h200 builds
the nvidia class a CUDA platform exports in its place. No forward runs: the nvidia class's forward
launches Triton kernels at every layer, which need a GPU (reports/vllm/dsa_path.md).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "lab"), str(ROOT / "tests" / "unit" / "preflight")]


def emit(check: str, **values: Any) -> None:
    print(json.dumps({"check": check, **values}), flush=True)


def cache_round_trip(torch: Any) -> None:
    """indexer_k_quant_and_cache then cp_gather_indexer_k_quant_cache, vLLM's wrappers."""
    from vllm import _custom_ops as ops

    head_dim, block_size, tokens = 128, 4, 6
    cache = torch.zeros(3, block_size, head_dim + 4, dtype=torch.uint8)
    k = torch.zeros(tokens, head_dim, dtype=torch.bfloat16)
    k[:, 0] = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])  # amax per token: a power of two
    slots = torch.tensor([5, 6, 7, 8, 9, 10])  # block 1 slots 1..3, block 2 slots 0..2
    ops.indexer_k_quant_and_cache(k, cache, slots, 128, "ue8m0")
    dst_k = torch.zeros(tokens, head_dim, dtype=torch.uint8)
    dst_scale = torch.zeros(tokens, 4, dtype=torch.uint8)
    block_table = torch.tensor([[1, 2]], dtype=torch.int32)
    # the gather reads positions 0..5 of the sequence: block 1 slots 0..3, block 2 slots 0..1
    ops.cp_gather_indexer_k_quant_cache(
        cache, dst_k, dst_scale, block_table, torch.tensor([0, tokens], dtype=torch.int32)
    )
    values = dst_k.view(torch.float8_e4m3fn).float()[:, 0]
    scales = dst_scale.view(torch.float32).reshape(-1)
    emit("cache", dequantized=(values * scales).tolist())


def paged_logits(torch: Any, dsa: Any) -> None:
    """fp8_fp4_paged_mqa_logits (the captured decode kernel) against vLLM's torch reference."""
    from vllm.utils import deep_gemm
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_paged_mqa_logits_torch

    gen = torch.Generator().manual_seed(0)
    batch, heads, head_dim, block_size, blocks, max_len = 3, 4, 128, 4, 8, 16
    cache = torch.zeros(blocks, block_size, 1, head_dim + 4, dtype=torch.uint8)
    keys = torch.randn(blocks * block_size, head_dim, generator=gen).to(torch.bfloat16)
    slots = torch.arange(blocks * block_size)
    dsa.indexer_k_quant_and_cache(keys, cache.view(blocks, block_size, -1), slots, 128, "ue8m0")
    q = torch.randn(batch, 1, heads, head_dim, generator=gen).to(torch.float8_e4m3fn)
    weights = torch.rand(batch, heads, generator=gen)
    lens = torch.tensor([[5], [16], [9]], dtype=torch.int32)
    tables = torch.tensor([[7, 1, 0, 0], [2, 3, 4, 5], [6, 0, 1, 0]], dtype=torch.int32)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, block_size, 132)
    got = deep_gemm.fp8_fp4_paged_mqa_logits(
        (q, None), cache, weights, lens, tables, schedule, max_model_len=max_len
    )
    want = fp8_paged_mqa_logits_torch(q, cache, weights, lens, tables, max_len)
    inside = torch.arange(max_len) < lens.reshape(-1, 1)
    error = (got.float() - want).abs()[inside].max().item()
    scale = want[inside].abs().max().item()
    emit("paged_logits", shape=list(got.shape), dtype=str(got.dtype), rel_error=error / scale)


def prefill_logits(torch: Any) -> None:
    """fp8_fp4_mqa_logits (prefill, compressed rows) against vLLM's torch reference."""
    from vllm.utils import deep_gemm
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_mqa_logits_torch

    gen = torch.Generator().manual_seed(1)
    rows, heads, head_dim, n = 5, 4, 128, 12
    q = torch.randn(rows, heads, head_dim, generator=gen).to(torch.float8_e4m3fn)
    k = torch.randn(n, head_dim, generator=gen).to(torch.float8_e4m3fn)
    k_scale = torch.rand(n, generator=gen) + 0.5
    weights = torch.rand(rows, heads, generator=gen)
    ks = torch.tensor([0, 0, 3, 3, 6], dtype=torch.int32)
    ke = torch.tensor([1, 2, 7, 9, 12], dtype=torch.int32)
    width = int((ke - ks).max())
    got = deep_gemm.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, width)
    full = fp8_mqa_logits_torch(q, (k, k_scale.reshape(-1, 1)), weights, ks, ke)
    error, scale = 0.0, 0.0
    for i in range(rows):
        span = int(ke[i] - ks[i])
        want = full[i, int(ks[i]) : int(ke[i])]
        error = max(error, (got[i, :span].float() - want).abs().max().item())
        scale = max(scale, want.abs().max().item())
    emit("prefill_logits", shape=list(got.shape), dtype=str(got.dtype), rel_error=error / scale)


def decode_topk(torch: Any) -> None:
    """top_k_per_row_decode through vLLM's wrapper: each row's top 2 within its context."""
    from vllm import _custom_ops as ops

    logits = torch.tensor([[0.0, 5.0, 1.0, 9.0, 7.0], [3.0, 1.0, 2.0, 8.0, 9.0]])
    indices = torch.full((2, 2), 99, dtype=torch.int32)
    # seq_lens [B] with next_n 1: row b scores its first seq_lens[b] columns
    ops.top_k_per_row_decode(
        logits, 1, torch.tensor([3, 5], dtype=torch.int32), indices, 2, 5, 1, 2
    )
    emit("decode_topk", indices=indices.tolist())


def meta_build(torch: Any) -> None:
    """DeepseekV32ForCausalLM on the meta device, the stand-ins registered."""
    import vllm_meta
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.workspace import init_workspace_manager

    choose = current_platform.get_attn_backend_cls

    def sparse_allowed(
        selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
    ) -> str:
        if attn_selector_config.use_sparse:
            return str(AttentionBackendEnum.FLASHMLA_SPARSE.get_path())
        return str(choose(selected_backend, attn_selector_config, num_heads))

    current_platform.__class__.get_attn_backend_cls = staticmethod(sparse_allowed)
    folder = vllm_meta._model_dir(str(ROOT / "lab" / "models" / "dsv32_4l" / "config.json"))
    vllm_meta._init_distributed(folder)
    torch.accelerator.empty_cache = lambda: None  # the workspace manager's, on no accelerator
    init_workspace_manager(torch.device("meta"))  # FlashMLA-sparse reserves its workspace
    measured = vllm_meta._measure(folder, 1)
    emit("meta_build", kv=measured["kv"], param_bytes=measured["param_bytes"])
    import dsa_standins
    from vllm.v1.attention.backends.mla import flashmla_sparse

    patched = dsa_standins.provide_sparse_mla()
    emit(
        "sparse_mla",
        patched=patched,
        served=flashmla_sparse.flash_mla_sparse_fwd is dsa_standins.flash_mla_sparse_fwd,
    )


def meta_build_h200(torch: Any) -> None:
    """The class an H200 builds: on CUDA `vllm.models.deepseek_v32` exports the nvidia
    DeepseekV32ForCausalLM (fused norm/rope and fused_q Triton kernels, FlashMLA-sparse's
    query join); on the CPU platform it exports the generic DeepseekV3ForCausalLM, which
    meta_build built. Put in its place, the nvidia class is built on the meta device the same way
    (after meta_build: the distributed state and the workspace are set up there)."""
    import vllm_meta
    from vllm.models.deepseek_v32.nvidia import model as nvidia

    built: list[str] = []
    cls = nvidia.DeepseekV32ForCausalLM
    original_init = cls.__init__

    @functools.wraps(original_init)  # the loader reads the signature (vllm_config keyword)
    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(f"{type(self).__module__}.{type(self).__qualname__}")
        original_init(self, *args, **kwargs)

    cls.__init__ = recording_init  # type: ignore[method-assign]
    # the loader resolves the architecture through the registry to what `vllm.models.
    # deepseek_v32` exports (cached per config since meta_build): hand it the nvidia class
    from vllm.model_executor.model_loader import utils as loader_utils

    loader_utils.get_model_architecture = lambda model_config: (cls, "DeepseekV32ForCausalLM")
    folder = vllm_meta._model_dir(str(ROOT / "lab" / "models" / "dsv32_4l" / "config.json"))
    measured = vllm_meta._measure(folder, 1)
    emit("meta_build_h200", built=built, kv=measured["kv"], param_bytes=measured["param_bytes"])


def main() -> int:
    import dsa_standins
    import torch
    import vllm  # noqa: F401  (the stand-ins patch vLLM's modules: import it first)

    emit("registered", names=dsa_standins.register())
    cache_round_trip(torch)
    paged_logits(torch, dsa_standins)
    prefill_logits(torch)
    decode_topk(torch)
    meta_build(torch)
    meta_build_h200(torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())

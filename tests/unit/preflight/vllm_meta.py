"""Build vLLM 0.33.0's own model classes on the meta device (CPU platform) and print what they hold.

    VLLM_TARGET_DEVICE=cpu python tests/unit/preflight/vllm_meta.py [--tp 1,2]
        [--backends FLASH_ATTN,FLASHMLA,...] [--quantization fp8_per_tensor] CONFIG.json ...

With ``--backends``, one JSON line first: each backend class's accepted block sizes (1 to 256)
and its preferred size for the installed release's CacheConfig.DEFAULT_BLOCK_SIZE. Then for each config and tensor-parallel size, rank 0's model is instantiated as vLLM's loader does
(``initialize_model`` under the model dtype, here on the meta device, so no memory is taken),
with the tensor-parallel group's size set to TP; then one JSON line per TP:
``{"config", "tp", "param_bytes", "param_bytes_by_dtype", "buffer_bytes", "kv": [{"kind",
"page_size_bytes", "block_size", "num_kv_heads", "head_size"}, ...]}``. A config's
quantization_config (FP8 checkpoints) is built as vLLM builds it, with a stand-in for the
scaled-mm kernel, which no CPU build of vLLM provides (kernels hold no parameters). ``buffer_bytes`` counts the buffers with more than one
element (the rotary cos/sin cache), leaving out the attention layers' scalar scales. The KV specs
are each attention layer's ``get_kv_cache_spec``: what vLLM's runner sizes the KV cache by.

Run by tests/unit/preflight/test_vllm_classes.py in a subprocess of its own: vLLM's platform is
chosen once per process (the CPU platform needs VLLM_TARGET_DEVICE=cpu before vLLM is imported)
and the process group it initializes stays.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import socket
import sys
import tempfile
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model_dir(config: str) -> str:
    folder = tempfile.mkdtemp(prefix="memest-vllm-meta-")
    shutil.copy(config, os.path.join(folder, "config.json"))
    return folder


def _measure(folder: str, tp: int, quantization: str | None = None) -> dict[str, Any]:
    import torch
    import vllm.distributed.parallel_state as ps
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    args = EngineArgs(
        model=folder,
        skip_tokenizer_init=True,
        load_format="dummy",
        max_model_len=4096,
        enforce_eager=True,
        quantization=quantization,
    )
    cfg = args.create_engine_config()
    with set_current_vllm_config(cfg):
        real = ps._TP
        rank0 = copy.copy(real)
        rank0.world_size, rank0.rank_in_group, rank0.ranks = tp, 0, list(range(tp))
        ps._TP = rank0
        ep_unset = ps._EP is None
        if ep_unset:  # hybrid MoE models (Qwen3-Next) read the EP group vLLM made for MoE only
            ps._EP = real
        try:
            with set_default_torch_dtype(cfg.model_config.dtype), torch.device("meta"):
                model = initialize_model(vllm_config=cfg, model_config=cfg.model_config)
            specs = [
                m.get_kv_cache_spec(cfg)
                for m in model.modules()
                if isinstance(m, AttentionLayerBase)
            ]
        finally:
            ps._TP = real
            if ep_unset:
                ps._EP = None
    seen: set[int] = set()
    params = buffers = 0
    by_dtype: dict[str, int] = {}
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params += p.numel() * p.element_size()
            key = str(p.dtype).removeprefix("torch.")
            by_dtype[key] = by_dtype.get(key, 0) + p.numel() * p.element_size()
    for b in model.buffers():
        # a view (Mamba2's conv_weights of conv1d.weight) holds no memory of its own
        if id(b) not in seen and b.numel() > 1 and b._base is None:
            seen.add(id(b))
            buffers += b.numel() * b.element_size()
    return {
        "tp": tp,
        "moe_workspace_bytes": _moe_workspace(model, MOE_TOKENS),
        "param_bytes": params,
        "param_bytes_by_dtype": by_dtype,
        "buffer_bytes": buffers,
        "kv": [
            {
                "kind": type(s).__name__,
                "page_size_bytes": s.page_size_bytes,
                "block_size": s.block_size,
                "num_kv_heads": getattr(s, "num_kv_heads", None),  # a MambaSpec has none
                "head_size": getattr(s, "head_size", None),
            }
            for s in specs
        ],
    }


#: Tokens of the forward whose fused-MoE workspace is measured (a profile run's batch).
MOE_TOKENS = 2048


def _moe_workspace(model: Any, tokens: int) -> int | None:
    """Bytes vLLM's workspace manager holds after a fused-MoE forward of ``tokens`` tokens:
    TritonExperts.workspace_shapes for the first RoutedExperts layer's w13 and top_k, requested as
    FusedMoEKernel._allocate_buffers requests them (on the meta device). None without MoE."""
    import math

    import torch
    import vllm.v1.worker.workspace as ws
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    layer = next((m for m in model.modules() if isinstance(m, RoutedExperts)), None)
    if layer is None:
        return None
    experts, n, k = layer.w13_weight.shape
    experts_obj = object.__new__(TritonExperts)  # workspace_shapes reads no instance state
    ws13, ws2, out = experts_obj.workspace_shapes(
        tokens, n, k, layer.top_k, experts, experts, None, MoEActivation.SILU
    )
    dtype = layer.w13_weight.dtype
    manager = ws.WorkspaceManager(torch.device("meta"))
    empty_cache = torch.accelerator.empty_cache
    torch.accelerator.empty_cache = lambda: None  # no accelerator on this CPU
    try:
        manager.get_simultaneous(((max(math.prod(ws13), math.prod(out)),), dtype), (ws2, dtype))
    finally:
        torch.accelerator.empty_cache = empty_cache
    return manager._workspace_size_bytes(manager._current_workspaces[0])


def backends(names: list[str]) -> dict[str, Any]:
    """Per backend: the block sizes 1..256 its class accepts and its preferred size for the
    release's default block size (what update_block_size_for_backend passes), or the error its
    import raises on this machine."""
    from vllm.config.cache import CacheConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    out: dict[str, Any] = {}
    for name in names:
        try:
            cls = AttentionBackendEnum[name].get_class()
            out[name] = {
                "supports": [n for n in range(1, 257) if cls.supports_block_size(n)],
                "preferred": cls.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE),
            }
        except Exception as exc:  # a kernel library that needs a GPU to import
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


class _NoScaledMM:
    """Stands in for vLLM's FP8 scaled-mm kernel on this CPU (none of its kernels builds here):
    kernels hold no parameters of their own, and layers are only built, never run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.config = args[0] if args else None

    def input_quant_key(self) -> None:  # the kernel quantizes its own input
        return None


def _stand_in_fp8_kernels() -> None:
    import vllm.model_executor.kernels.linear as linear

    linear.choose_scaled_mm_linear_kernel = lambda *a, **k: _NoScaledMM  # type: ignore[assignment]


def _init_distributed(folder: str) -> None:
    """A one-process gloo group: the model classes read the tensor-parallel group's size."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=folder, skip_tokenizer_init=True, max_model_len=4096)
    with set_current_vllm_config(cfg.create_engine_config()):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            local_rank=0,
            backend="gloo",
        )
        initialize_model_parallel(1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", help="config.json files")
    parser.add_argument("--tp", default="1", help="tensor-parallel sizes, comma-separated")
    parser.add_argument("--backends", default="", help="attention backends, comma-separated")
    parser.add_argument("--quantization", default=None, help="vLLM's --quantization (online fp8)")
    args = parser.parse_args(argv)
    if args.backends:
        print(json.dumps({"backends": backends(args.backends.split(","))}), flush=True)
    _stand_in_fp8_kernels()
    for n, config in enumerate(args.configs):
        folder = _model_dir(config)
        if n == 0:
            _init_distributed(folder)
        for tp in (int(x) for x in args.tp.split(",")):
            print(
                json.dumps({"config": config, **_measure(folder, tp, args.quantization)}),
                flush=True,
            )
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The vLLM modules memest patches, per release, named once for the patch list and the import watch.

Kept free of imports so that ``register()`` can watch for these modules without loading the
patch list (``hooks``) and what it imports. A new vLLM release is a new row of
``MODULES_BY_VERSION`` (and of ``hooks.PATCHES_BY_VERSION``).
"""

from __future__ import annotations

WORKER = "vllm.v1.worker.gpu_worker"
W2 = "vllm.v1.worker.gpu.model_runner"
W1 = "vllm.v1.worker.gpu_model_runner"  # Model Runner V1: gone in vLLM 0.34
CG = "vllm.v1.worker.gpu.cudagraph_utils"
AV = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"
ATTN = "vllm.v1.worker.gpu.attn_utils"
ADAPTORS = "vllm.compilation.compiler_interface"
EXTENSIBLE = "vllm.v1.worker.extensible_kv_cache"  # vLLM 0.34's growable KV cache

_COMMON: tuple[str, ...] = (WORKER, W2, CG, AV, ATTN, ADAPTORS)

MODULES_BY_VERSION: dict[str, tuple[str, ...]] = {
    "0.33.0": (*_COMMON, W1),
    "0.34.0": (*_COMMON, EXTENSIBLE),
}

#: vLLM 0.33.0's modules, for callers that name no release.
MODULES: tuple[str, ...] = MODULES_BY_VERSION["0.33.0"]

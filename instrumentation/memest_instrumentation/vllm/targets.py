"""The vLLM 0.33.0 modules memest patches, named once for the patch list and the import watch.

Kept free of imports so that ``register()`` can watch for these modules without loading the
patch list (``hooks``) and what it imports.
"""

from __future__ import annotations

WORKER = "vllm.v1.worker.gpu_worker"
W2 = "vllm.v1.worker.gpu.model_runner"
W1 = "vllm.v1.worker.gpu_model_runner"
CG = "vllm.v1.worker.gpu.cudagraph_utils"
AV = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"
ATTN = "vllm.v1.worker.gpu.attn_utils"
ADAPTORS = "vllm.compilation.compiler_interface"

MODULES: tuple[str, ...] = (WORKER, W2, W1, CG, AV, ATTN, ADAPTORS)

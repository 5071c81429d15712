"""vLLM 0.33.0's fused-MoE workspace: persistent scratch sized by the widest batch (bytes).

The modular fused-MoE kernel (``model_executor/layers/fused_moe/modular_kernel.py``,
``_allocate_buffers``) takes its GEMM scratch from the process-wide workspace manager
(``v1/worker/workspace.py``, ``WorkspaceManager.get_simultaneous``): one uint8 buffer per
micro-batch holding two views, each rounded up to 256 B, that grows to the largest request and
is never freed (the manager is locked after warm-up, so CUDA graphs reuse it). For the
unquantized Triton experts (``experts/triton_moe.py``, ``TritonExperts.workspace_shapes``), with
M tokens, top-k routes per token, N = the experts' w13 width per rank (2 x moe_intermediate for
a gated activation) and K = hidden:

- workspace13 = (M, top_k, max(N / 2, K)), shared with the output (M, K): max of the two;
- workspace2 = (M, top_k, max(N, K));

in the activation dtype, M = the forward's tokens with no chunking (``M_chunk = M_full``). The
profile run's forward of ``max_num_batched_tokens`` tokens is the widest, so the buffer is sized
by it and stays allocated after the profile pass: it is part of the profiling residue. Every
MoE layer of the model shares the one buffer. The routed experts' intermediate caches live in
it, not in the activations of the compiled pieces (the pre-flight's activation law leaves them
out). The expert count enters nothing: few wide experts (Mixtral: intermediate 14,336 over hidden
4,096) size both views by the intermediate, many small ones (DeepSeek-V3: 2,048 under hidden
7,168) by the hidden size; shared experts run as a dense MLP outside the workspace.
"""

from __future__ import annotations

import math

from memest.estimate.model_shape import ModelShape

#: WorkspaceManager.get_simultaneous aligns each view to this many bytes.
WORKSPACE_ALIGN_BYTES = 256


def fused_moe_workspace_shapes(
    shape: ModelShape, tokens: int
) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int]]:
    """(workspace13, workspace2, output) shapes of TritonExperts for ``tokens`` tokens."""
    n, k, top_k = 2 * shape.moe_intermediate, shape.hidden, shape.topk
    return (tokens, top_k, max(n // 2, k)), (tokens, top_k, max(n, k)), (tokens, k)


def fused_moe_workspace_bytes(shape: ModelShape, tokens: int) -> int:
    """Bytes of the fused-MoE workspace after a forward of ``tokens`` tokens (0 without MoE)."""
    if not shape.moe_layers or tokens <= 0:
        return 0
    ws13, ws2, out = fused_moe_workspace_shapes(shape, tokens)
    views = (max(math.prod(ws13), math.prod(out)), math.prod(ws2))
    align = WORKSPACE_ALIGN_BYTES
    return sum(math.ceil(v * shape.dtype_bytes / align) * align for v in views)

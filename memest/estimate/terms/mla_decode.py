"""TRITON_MLA's split-KV decode logits in vLLM's workspace manager (a profiling-residue share).

vLLM 0.33.0's TritonMLAImpl.reserve_workspace (v1/attention/backends/mla/triton_mla.py), called
by every MLA layer's forward in the profile run, grows the workspace manager's one buffer
(v1/worker/workspace.py) to the decode attention's worst case so that forward_mqa never grows it
once the manager is locked:

    (max_num_seqs x max_decode_query_len, heads, num_kv_splits, kv_lora_rank + 1) float32

with max_decode_query_len = 1 + num_speculative_tokens (v1/attention/backend.py) and
num_kv_splits = min(next_pow2(max(1, max_model_len // 512)), 2 x SMs). The buffer outlives the
profile run (it is what the KV budget is sized around), so it is residue; the manager's buffer
is one, shared with the fused-MoE workspace and DSA's, so the residue holds the largest request.
"""

from __future__ import annotations

from memest.estimate.model_shape import ModelShape

#: vLLM 0.33.0 triton_mla.py: _MIN_WORK_PER_SPLIT and _SPLIT_OCCUPANCY_MULTIPLIER.
MIN_WORK_PER_SPLIT = 512
SPLIT_OCCUPANCY_MULTIPLIER = 2
#: The logits are float32 (torch.float32 in _reserve_attn_logits_workspace).
LOGITS_BYTES = 4
#: get_simultaneous rounds each tensor up to this many bytes (v1/worker/workspace.py).
WORKSPACE_ALIGN = 256
#: The backend that reserves it.
TRITON_MLA = "TRITON_MLA"


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def num_kv_splits(max_model_len: int, sms: int) -> int:
    """triton_mla.py's _compute_num_kv_splits at the longest sequence."""
    ideal = _next_pow2(max(1, max_model_len // MIN_WORK_PER_SPLIT))
    return min(ideal, sms * SPLIT_OCCUPANCY_MULTIPLIER)


def logits_workspace_bytes(
    shape: ModelShape,
    backend: str,
    *,
    max_num_seqs: int,
    max_model_len: int,
    num_speculative_tokens: int,
    sms: int,
) -> int:
    """Bytes TRITON_MLA reserves in the workspace manager (0 for another backend or no MLA)."""
    if backend != TRITON_MLA or shape.family != "mla" or shape.sparse:
        return 0
    rows = max_num_seqs * (1 + num_speculative_tokens)
    size = rows * shape.heads * num_kv_splits(max_model_len, sms) * (shape.kv_lora_rank + 1)
    size *= LOGITS_BYTES
    return -(-size // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


LAW = " + TRITON_MLA's split-KV decode logits (max_num_seqs x heads x splits x (kv_lora_rank + 1) fp32)"

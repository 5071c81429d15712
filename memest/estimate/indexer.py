"""The DSA indexer's logits: what DeepSeek sparse attention's scoring step allocates.

vLLM 0.33.0's `sparse_attn_indexer` (model_executor/layers/sparse_attn_indexer.py) scores every
query row against every candidate KV position: a [query rows x positions scored] tensor from
DeepGEMM's MQA-logits kernel. Its element is FP32 on SM90 and BF16 on SM100, where vLLM's
`as_fp32_logits` then makes an FP32 copy of the same shape (decode: unless the top-k backend is
"deep_select"). In a FULL decode graph the rows are the padded decode tokens, batch x next_n
(next_n = 1 + speculative tokens), and the positions are max_model_len: the paged kernel's
output is [B * next_n, max_model_len] whatever the contexts (vllm/utils/deep_gemm.py).

A prefill's logits are [query tokens, gathered keys] per chunk, and vLLM's indexer metadata builder
(v1/attention/backends/mla/indexer.py ``_split_indexer_prefill_chunks``) cuts the step into chunks
of at most VLLM_SPARSE_INDEXER_MAX_LOGITS_MB (512 MiB) of FP32 logits. The profile run does not
score: ``sparse_attn_indexer`` reserves that bound instead, one uint8 tensor of
VLLM_SPARSE_INDEXER_MAX_LOGITS_MB MiB, freed when the layer's call returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from memest.errors import ConfigError

FP32_BYTES = 4


@dataclass(frozen=True)
class IndexerLogits:
    """Bytes of one indexer call's logits: the kernel's output and vLLM's FP32 copy (0 when
    the kernel's output is FP32 already)."""

    rows: int
    positions: int
    kernel_bytes: int
    fp32_copy_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.kernel_bytes + self.fp32_copy_bytes


def indexer_logits(rows: int, positions: int, kernel_element_bytes: int) -> IndexerLogits:
    """The size law: rows x positions x bytes, plus the FP32 copy of a narrower output."""
    if rows < 0 or positions < 0:
        raise ConfigError("indexer_logits", (rows, positions), "rows and positions must be >= 0")
    if kernel_element_bytes not in (2, FP32_BYTES):
        raise ConfigError(
            "kernel_element_bytes", kernel_element_bytes, "element bytes must be 2 or 4"
        )
    kernel = rows * positions * kernel_element_bytes
    copy = rows * positions * FP32_BYTES if kernel_element_bytes != FP32_BYTES else 0
    return IndexerLogits(rows, positions, kernel, copy)


def decode_indexer_logits(
    num_requests: int, num_speculative_tokens: int, max_model_len: int, kernel_element_bytes: int
) -> IndexerLogits:
    """A FULL decode graph of num_requests requests: [B x (1 + K), max_model_len]."""
    rows = num_requests * (1 + num_speculative_tokens)
    return indexer_logits(rows, max_model_len, kernel_element_bytes)


#: vLLM 0.33.0's default VLLM_SPARSE_INDEXER_MAX_LOGITS_MB (vllm/envs.py).
MAX_LOGITS_MB = 512
#: Bytes of the indexer kernel's logits element: FP32 on SM90, BF16 on SM100 (DeepGEMM).
SM90_ELEMENT_BYTES = FP32_BYTES
SM100_ELEMENT_BYTES = 2


def kernel_element_bytes(sm100: bool) -> int:
    """The MQA-logits kernel's element bytes on a GPU kind (module docstring)."""
    return SM100_ELEMENT_BYTES if sm100 else SM90_ELEMENT_BYTES


def profile_logits_bytes(max_logits_mb: int = MAX_LOGITS_MB) -> int:
    """What the profile run's indexer reserves for a prefill's logits: the chunker's bound."""
    if max_logits_mb < 0:
        raise ConfigError("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", max_logits_mb, "must be >= 0")
    return max_logits_mb * 1024 * 1024


#: vLLM 0.33.0's radix top-k workspace the profile run reserves (indexer_topk.py).
RADIX_TOPK_WORKSPACE_BYTES = 1024 * 1024
#: The max_model_len up to which vLLM 0.33.0 resolves sparse_mla_prefill_workspace_factor to 5
#: (2 above it; vllm/config/vllm.py).
WORKSPACE_FACTOR_LEN = 256 * 1024
#: vLLM's WorkspaceManager.get_simultaneous aligns each view to this many bytes.
WORKSPACE_ALIGN = 256
#: Bytes per key of the indexer's gathered K workspace: FP8 values beside a 4-byte scale.
GATHER_SCALE_BYTES = 4


def _aligned(n: int) -> int:
    return -(-n // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def prefill_workspace_bytes(max_model_len: int, index_head_dim: int) -> int:
    """What the profile run's indexer asks vLLM's workspace manager for (sparse_attn_indexer's
    profile branch): the K gather of get_max_prefill_buffer_size keys, max_model_len x
    (576 x 2 // 132) x sparse_mla_prefill_workspace_factor, each head_dim FP8 values and a
    4-byte scale, plus the radix top-k workspace. The manager keeps one buffer, the largest of
    its callers' requests."""
    factor = 5 if max_model_len <= WORKSPACE_FACTOR_LEN else 2
    keys = max_model_len * (576 * 2 // 132) * factor
    return (
        _aligned(keys * index_head_dim)
        + _aligned(keys * GATHER_SCALE_BYTES)
        + _aligned(RADIX_TOPK_WORKSPACE_BYTES)
    )


def topk_indices_bytes(max_num_batched_tokens: int, index_topk: int) -> int:
    """The DSA model's top-k index buffer (nvidia/model.py: [max_num_batched_tokens, index_topk]
    int32, allocated with the model)."""
    return max_num_batched_tokens * index_topk * 4

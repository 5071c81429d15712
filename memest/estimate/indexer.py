"""The DSA indexer's logits: what DeepSeek sparse attention's scoring step allocates.

vLLM 0.33.0's `sparse_attn_indexer` (model_executor/layers/sparse_attn_indexer.py) scores every
query row against every candidate KV position: a [query rows x positions scored] tensor from
DeepGEMM's MQA-logits kernel. Its element is FP32 on SM90 and BF16 on SM100, where vLLM's
`as_fp32_logits` then makes an FP32 copy of the same shape (decode: unless the top-k backend is
"deep_select"). In a FULL decode graph the rows are the padded decode tokens, batch x next_n
(next_n = 1 + speculative tokens), and the positions are max_model_len: the paged kernel's
output is [B * next_n, max_model_len] whatever the contexts (vllm/utils/deep_gemm.py).
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

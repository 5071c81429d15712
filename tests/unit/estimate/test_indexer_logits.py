"""The indexer-logits size law against the shapes vLLM 0.33.0's code gives.

sparse_attn_indexer's decode path (model_executor/layers/sparse_attn_indexer.py): q is packed
to [batch, next_n, H, D], so num_padded_tokens = batch * next_n rows, and DeepGEMM's paged
kernel returns [B * next_n, max_model_len] (vllm/utils/deep_gemm.py): FP32 on SM90, BF16 on
SM100 followed by as_fp32_logits' FP32 tensor of the same shape. The figures below are those
products worked out by hand.
"""

from __future__ import annotations

import pytest

from memest.errors import ConfigError
from memest.estimate.indexer import decode_indexer_logits, indexer_logits


def test_sm90_decode_graph_of_64_requests_at_4096_positions() -> None:
    law = decode_indexer_logits(64, 0, 4096, 4)
    assert (law.rows, law.positions) == (64, 4096)
    assert law.kernel_bytes == 1_048_576  # 64 x 4,096 x 4 = 1 MiB
    assert law.fp32_copy_bytes == 0


def test_sm100_pair_bf16_then_fp32_copy_with_three_draft_tokens() -> None:
    law = decode_indexer_logits(32, 3, 8192, 2)
    assert law.rows == 128  # 32 requests x next_n 4
    assert law.kernel_bytes == 2_097_152  # 128 x 8,192 x 2 = 2 MiB
    assert law.fp32_copy_bytes == 4_194_304  # the same shape in FP32 = 4 MiB
    assert law.total_bytes == 6_291_456


def test_prefill_chunk_rows_by_positions() -> None:
    # a 2,048-token prefill chunk scoring up to 2,048 positions (compressed rows)
    assert indexer_logits(2048, 2048, 4).total_bytes == 16 * 1024 * 1024


def test_bad_element_size_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="kernel_element_bytes=1: element bytes must be 2 or 4"):
        indexer_logits(1, 1, 1)

"""Which prefill path vLLM 0.33.0 takes for a DSA batch, with vLLM's own functions on this CPU.

FlashMLA-sparse's metadata builder splits a batch with split_decodes_and_prefills(require_uniform=
True, threshold 256 at 128 heads on SM90: FlashMLASparseMetadataBuilder.__init__), and dense MHA
over the cached context runs when the prefills' longest sequence fits index_topk
(_use_dense_mha_prefill). The lab's context step (lab/vllm_runs.py): 17 requests over a cached
prefix of 1,984 tokens (31 blocks of 64 of its 2,032), 64 new tokens each, or with
context_mixed_queries the first 64 and the rest 63. memest.estimate.mla_context bounds the dense
chunk from these rules.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from tests.conftest import require_or_skip

pytestmark = pytest.mark.vllm
THRESHOLD = 256  # FlashMLASparseMetadataBuilder: {16: 128, 32: 128, 64: 256, 128: 256}[128]
TOPK, CACHED = 2048, 1984


def _vllm() -> tuple[Any, Any]:
    try:
        from vllm.model_executor.layers.attention.sparse_mla_attention import (
            _use_dense_mha_prefill,
        )
        from vllm.v1.attention.backends.utils import split_decodes_and_prefills
    except Exception as exc:
        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")
    return split_decodes_and_prefills, _use_dense_mha_prefill


def _batch(query_lens: list[int]) -> Any:
    import torch

    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return types.SimpleNamespace(
        max_query_len=max(query_lens),
        num_reqs=len(query_lens),
        num_actual_tokens=starts[-1],
        query_start_loc_cpu=torch.tensor(starts, dtype=torch.int32),
    )


def _split(query_lens: list[int]) -> tuple[int, int, int, int]:
    split, _ = _vllm()
    out = split(_batch(query_lens), decode_threshold=THRESHOLD, require_uniform=True)
    return tuple(int(v) for v in out)  # type: ignore[return-value]


def test_equal_short_suffixes_are_all_decodes_the_sparse_attend() -> None:
    assert _split([64] * 17) == (17, 0, 17 * 64, 0)


def test_suffixes_that_differ_are_prefills_over_the_cached_context() -> None:
    assert _split([64] + [63] * 16) == (1, 16, 64, 16 * 63)
    _, dense = _vllm()
    config = types.SimpleNamespace(
        attention_config=types.SimpleNamespace(hisparse_config=None, sparse_mla_force_mqa=False)
    )
    # the prefills' longest sequence: 1,984 cached + 63 new fits the top-2,048
    assert dense(config, CACHED + 63, TOPK)
    assert not dense(config, TOPK + 1, TOPK)

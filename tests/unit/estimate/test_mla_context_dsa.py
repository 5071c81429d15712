"""The sparse MLA (DSA) context term, against sizes worked by hand from vLLM 0.33.0's code.

sparse_mla_attention.py: the sparse builder's chunked-prefill workspace
(determine_chunked_prefill_workspace_size) and dense MHA only when the prefill's longest sequence
fits index_topk (_use_dense_mha_prefill); flashmla_sparse.py: the sparse attend's tensors
(_forward_bf16_kv, _bf16_flash_mla_kernel). The start is the H200 DSA start of call 33
(tests/data/starts), DeepSeek-V3.2's attention: 128 heads, kv_lora_rank 512, qk 128 + 64, v 128,
index_topk 2,048 (lab/models/dsv32_4l/config.json), BF16, FLASH_ATTN prefill (v padded).
"""

from __future__ import annotations

from pathlib import Path

from memest.estimate.mla_context import (
    chunked_prefill_workspace_tokens,
    dsa_context_bytes,
    run_mla_context_bytes,
    sparse_attend_bytes,
    sparse_attend_tensors,
    sparse_context_chunk_rows,
)
from memest.estimate.model_shape import ModelShape, model_shape
from memest.schema import RunConfig, RunReport

STARTS = Path(__file__).resolve().parents[2] / "data" / "starts"
REPORT = STARTS / "call33.S_dsv32_4l_s64_t2048.apply-hist.report.rank0.json"
BLOCK = 64  # FLASHMLA_SPARSE's KV block
MiB = 1 << 20


def _config(**changes: object) -> RunConfig:
    config = RunReport.model_validate_json(REPORT.read_text()).config
    assert config.model_dims is not None
    # call 33's report predates recording the indexer's fields: lab/models/dsv32_4l's values
    indexer = {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}
    dims = config.model_dims.model_copy(update=indexer)
    return config.model_copy(update={"model_dims": dims, **changes})


def _shape(tp: int = 1) -> ModelShape:
    dims = _config().model_dims
    assert dims is not None
    return model_shape(dims.model_dump(exclude_none=True) | {"torch_dtype": dims.dtype}, tp=tp)


def test_the_sparse_workspace_is_the_dense_rule_capped_at_seqs_times_topk() -> None:
    # min(max(8 x 4,096, 4 x 64 x 64), 65,536, 64 x 2,048)
    assert chunked_prefill_workspace_tokens(4096, 64, BLOCK, 2048) == 32768
    # min(max(32,768, 2,048), 65,536, 8 x 2,048): the top-k cap binds
    assert chunked_prefill_workspace_tokens(4096, 8, BLOCK, 2048) == 16384
    # min(max(8,192, 16,384), 65,536, 131,072)
    assert chunked_prefill_workspace_tokens(1024, 64, BLOCK, 2048) == 16384


def test_a_dense_chunk_holds_at_most_prefills_times_topk_less_one_rows() -> None:
    assert sparse_context_chunk_rows(32768, 64, 2048, 2048) == 32768
    assert sparse_context_chunk_rows(16384, 8, 2048, 2048) == 8 * 2047
    assert sparse_context_chunk_rows(16384, 64, 4, 2048) == 4 * 2047  # 4 tokens: 4 prefills


def test_the_sparse_attends_tensors_by_hand() -> None:
    t = sparse_attend_tensors(_shape(), 2048, 2048)
    assert t == {
        "topk": 2048 * 2048 * 4,
        "topk_length": 2048 * 4,
        "out": 2048 * 128 * 512 * 2,
        "max_logits": 2048 * 128 * 4,
        "lse": 2048 * 128 * 4,
    }
    # TP 8: 16 heads per rank, padded to the kernel's 64
    assert sparse_attend_tensors(_shape(tp=8), 2048, 2048)["out"] == 2048 * 64 * 512 * 2
    # out 256 MiB and top-k 16 MiB in segments of their own; the counts (8 KiB) and max-logits
    # (1 MiB) share one 2 MiB small-pool segment, the LSE takes a second
    assert sparse_attend_bytes(_shape(), 2048, 2048) == 256 * MiB + 16 * MiB + 2 * 2 * MiB


#: a serving step's prompt-logprobs chunk for the 129,280-entry vocabulary: 1,024 rows in bf16,
#: rounded up to 2 MiB; the activation headroom holds it (memest.estimate.sampler)
PROMPT_CHUNK = -(-1024 * 129280 * 2 // (2 * MiB)) * 2 * MiB


def test_call33s_configuration_keeps_a_whole_32768_row_chunk() -> None:
    # step (2,048 rows): kv_nope 2,048 x 128 x 256 x 2, k and padded v 2,048 x 128 x 192 x 2;
    # the chunk (32,768 rows): 2 GiB, 1.5 GiB, 1.5 GiB, each a segment of its own
    step = 2048 * 128 * 2 * (256 + 192 + 192)
    chunk = 32768 * 128 * 2 * (256 + 192 + 192)
    assert step + chunk == 5_704_253_440
    # less the prompt-logprobs chunk the activation headroom holds: 1,024 x 129,280 x 2 B
    # (252.5 MiB), a segment rounded up to 2 MiB
    assert run_mla_context_bytes(_config(), BLOCK) == step + chunk - PROMPT_CHUNK


def test_few_sequences_cap_the_chunk_at_their_contexts() -> None:
    # 8 sequences: the workspace is 16,384 rows and 8 prefills hold 8 x 2,047 = 16,376 of them;
    # kv_nope 16,376 x 128 x 256 x 2 = 1,073,217,536 B -> a 512 x 2 MiB segment, k and padded v
    # 804,913,152 B -> 384 x 2 MiB each; the step as above
    step = 2048 * 128 * 2 * (256 + 192 + 192)
    chunk = (512 + 384 + 384) * 2 * MiB
    assert step + chunk == 3_019_898_880
    assert run_mla_context_bytes(_config(max_num_seqs=8), BLOCK) == step + chunk - PROMPT_CHUNK
    # without a recorded index_topk the dense rule's 32,768-row workspace stays
    dense = _config(max_num_seqs=8)
    assert dense.model_dims is not None
    dense = dense.model_copy(
        update={"model_dims": dense.model_dims.model_copy(update={"index_topk": None})}
    )
    assert run_mla_context_bytes(dense, BLOCK) == 5_704_253_440 - PROMPT_CHUNK


def test_the_sparse_attend_sets_the_term_when_it_is_the_larger() -> None:
    # FlashAttention 3 (no padded v), no cached context: the dense step's kv_nope 128 MiB and k
    # 96 MiB against the sparse attend's 276 MiB
    assert dsa_context_bytes(_shape(), 0, 2048, 2048, v_padded=False) == 276 * MiB
    assert dsa_context_bytes(_shape(), 0, 2048, 2048, v_padded=True) == 2048 * 128 * 2 * 640

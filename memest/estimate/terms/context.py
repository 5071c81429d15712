"""The pre-flight's prefill-over-context term (MLA's up-projection; DSA's dense-MHA prefill or
sparse attend) and its range, from memest.estimate.mla_context's one entry, context_term_bytes."""

from __future__ import annotations

from memest.estimate.mla_context import (
    chunked_prefill_workspace_tokens,
    context_term_bytes,
    second_chunk_bytes,
)
from memest.estimate.model_shape import ModelShape
from memest.schema import RunConfig


def _grid(config: RunConfig) -> tuple[int, int, int]:
    mml, seqs, mbt = config.max_model_len, config.max_num_seqs, config.max_num_batched_tokens
    assert mml is not None and seqs is not None and mbt is not None
    return mml, seqs, mbt


def workspace_tokens(shape: ModelShape, config: RunConfig, block_size: int) -> int:
    """Tokens of MLA's chunked-prefill workspace (sparse MLA: capped at seqs x index_topk)."""
    mml, seqs, _ = _grid(config)
    return chunked_prefill_workspace_tokens(mml, seqs, block_size, shape.index_topk)


def context_law(
    shape: ModelShape, config: RunConfig, block_size: int, *, v_padded: bool
) -> tuple[int, str]:
    """The term's bytes and the law that gave them ("no MLA": 0)."""
    if shape.family != "mla":
        return 0, "no MLA"
    mml, seqs, mbt = _grid(config)
    tokens = workspace_tokens(shape, config, block_size)
    what = "kv_nope, k and v padded for FlashAttention 2" if v_padded else "kv_nope and k"
    term = context_term_bytes(shape, mml, seqs, block_size, mbt, v_padded=v_padded)
    if shape.index_topk:
        return term, (
            f"DSA: the larger of the dense-MHA prefill ({what} of {mbt} new tokens and of one "
            f"chunk of at most {tokens} cached rows) and the sparse attend over the top-"
            f"{shape.index_topk} of {mbt} rows; no profile stand-in"
        )
    return term, (
        f"{what} of {mbt} new tokens and of one {tokens}-token chunked-prefill workspace chunk "
        "(heads x dims x dtype), less the profile run's stand-in"
    )


def context_range(shape: ModelShape, config: RunConfig, block_size: int, *, v_padded: bool) -> int:
    """The term's range: FA2's padded v where FA3 is assumed, and a second full chunk.

    A DSA model's the same: its dense-MHA chunk over cached context is reached by a step whose
    prefills' sequences fit the top-k (reports/vllm, calls 41-42: 31,744 and 32,640 rows of the
    32,768-row chunk on the H200).
    """
    if shape.family != "mla":
        return 0
    mml, seqs, mbt = _grid(config)
    padded = 0
    if not v_padded:
        padded = context_term_bytes(
            shape, mml, seqs, block_size, mbt, v_padded=True
        ) - context_term_bytes(shape, mml, seqs, block_size, mbt, v_padded=False)
    tokens = workspace_tokens(shape, config, block_size)
    return padded + second_chunk_bytes(shape, tokens, mbt, v_padded=True)

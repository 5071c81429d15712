"""The what-if's inverse questions: what it takes to hold N tokens of KV cache.

- the gpu_memory_utilization a grid needs for N tokens (vLLM requests ceil(util x total) bytes,
  and the KV cache gets what the full-initialization terms leave of it, in whole blocks);
- the largest max_num_seqs whose capture plan still leaves N tokens, the rest of the start's
  configuration kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memest.errors import ConfigError, ReportFormatError
from memest.estimate import kv_groups
from memest.estimate.kv import hybrid_lengths, kv_page_bytes
from memest.estimate.phases import total_bytes
from memest.schema import KVCacheSpec, RunReport, WhatIf

# vLLM accepts utilizations with any precision; four decimals keep the answer readable and
# never below the need (rounded up).
_UTIL_DECIMALS = 4
MAX_SEQS_LIMIT = 1 << 14


def kv_bytes_for_tokens(
    report: RunReport, tokens: int, spec: KVCacheSpec | None = None, field: str = "kv_tokens"
) -> int:
    """Bytes of KV cache that hold ``tokens`` tokens: whole blocks of ``spec`` (default: the
    start's)."""
    spec = spec or report.kv_cache
    if spec is None:
        raise ReportFormatError(f"report {report.report_id}: kv_cache spec is missing")
    if tokens <= 0:
        raise ConfigError(field, tokens, "must be positive")
    if spec.groups:  # a hybrid holds tokens / max_model_len requests of every group
        c = report.config
        lengths = hybrid_lengths(spec, c.max_model_len, c.max_num_batched_tokens)
        return kv_groups.bytes_for_requests(spec, tokens / lengths.max_model_len, lengths)
    return math.ceil(tokens / spec.block_size) * kv_page_bytes(spec)


def _spec_to(report: RunReport, result: WhatIf) -> KVCacheSpec | None:
    """The KV-cache spec at G': the start's, with G''s bytes per token."""
    spec = report.kv_cache
    if spec is None or spec.groups or result.kv_bytes_per_token_to is None:
        return spec
    page = result.kv_bytes_per_token_to * spec.block_size
    return spec.model_copy(update={"page_size_bytes": page, "num_blocks": None, "kv_tokens": None})


def utilization_for_tokens(
    report: RunReport, result: WhatIf, tokens: int, field: str = "kv_tokens", asked: int = 0
) -> float:
    """The gpu_memory_utilization under which grid G' of ``result`` holds ``tokens`` tokens.

    The non-KV terms at G' are the budget at G' minus the KV budget at G'. ``field`` and
    ``asked`` name the question in errors (kv_tokens N, or concurrency C).

    Raises:
        ConfigError: no utilization holds them.
    """
    total = total_bytes(report)
    if result.terms_to is None or result.kv_budget_bytes_to is None:
        raise ReportFormatError(f"report {report.report_id}: the what-if has no terms for G'")
    non_kv = result.terms_to.requested_bytes - result.kv_budget_bytes_to
    need = non_kv + kv_bytes_for_tokens(report, tokens, _spec_to(report, result), field)
    scale = 10**_UTIL_DECIMALS
    util: float = math.ceil(need / total * scale) / scale
    if util > 1:
        raise ConfigError(
            field,
            asked or tokens,
            f"{tokens:,} KV tokens need {need} B, more than the GPU's {total} B at any grid",
        )
    return util


def seqs_ceiling(report: RunReport, changes: Mapping[str, Any] | None) -> tuple[int, str]:
    """The largest max_num_seqs the search may answer, and what sets it: vLLM refuses
    max_num_seqs above max_num_batched_tokens (G''s); past MAX_SEQS_LIMIT the plan stops growing."""
    mbt = (changes or {}).get("max_num_batched_tokens", report.config.max_num_batched_tokens)
    if isinstance(mbt, int) and not isinstance(mbt, bool) and 0 < mbt < MAX_SEQS_LIMIT:
        return mbt, "max_num_batched_tokens"
    return MAX_SEQS_LIMIT, "the capture plan's size cap"


def largest_max_num_seqs(
    report: RunReport,
    tokens: int,
    what_if: Any,
    changes: Mapping[str, Any] | None = None,
    ceiling: int = MAX_SEQS_LIMIT,
) -> int | None:
    """The largest max_num_seqs up to ``ceiling`` (other changes kept) whose KV budget still
    holds ``tokens``.

    ``what_if(report, grid)`` is memest.estimate.what_if. None when even max_num_seqs=1 does not.
    """
    base = dict(changes or {})

    def holds(seqs: int) -> bool:
        try:
            result = what_if(report, {**base, "max_num_seqs": seqs})
        except ConfigError:  # a grid vLLM refuses (max_num_seqs above max_num_batched_tokens)
            return False
        return bool(result.kv_tokens_to is not None and result.kv_tokens_to >= tokens)

    if not holds(1):
        return None
    low, high = 1, 2
    while high <= ceiling and holds(high):
        low, high = high, high * 2
    high = min(high, ceiling + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if holds(mid) else (low, mid)
    return low


def target_tokens(report: RunReport, kv_tokens: int | None, concurrency: int | None) -> int | None:
    """N of an inverse question: ``kv_tokens``, or ``concurrency`` x the start's max_model_len.

    Raises:
        ConfigError: both are given, one is not positive, or max_model_len is unknown.
    """
    if kv_tokens is not None and concurrency is not None:
        raise ConfigError("concurrency", concurrency, "give kv_tokens or concurrency, not both")
    if kv_tokens is not None:
        if kv_tokens <= 0:
            raise ConfigError("kv_tokens", kv_tokens, "must be positive")
        return kv_tokens
    if concurrency is None:
        return None
    if concurrency <= 0:
        raise ConfigError("concurrency", concurrency, "must be positive")
    length = report.config.max_model_len
    if not length:
        raise ConfigError("concurrency", concurrency, "the report has no max_model_len")
    return concurrency * length


def concurrency_at(max_model_len: int | None, tokens: int | None) -> float | None:
    """Requests of ``max_model_len`` tokens that ``tokens`` KV tokens hold."""
    if tokens is None or not max_model_len:
        return None
    return tokens / max_model_len


def inverse_answer(
    report: RunReport,
    result: WhatIf,
    tokens: int,
    changes: Mapping[str, Any] | None,
    what_if: Any,
    question: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """The answers to "what holds ``tokens`` tokens": the utilization under G' and, for a grid
    written as changes, the largest max_num_seqs that still holds them (never above G''s
    max_num_batched_tokens, which vLLM requires). ``question`` is (field, value) as asked
    (("concurrency", C) or ("kv_tokens", N)), for errors."""
    field, asked = question or ("kv_tokens", tokens)
    answer: dict[str, Any] = {
        "kv_tokens": tokens,
        "gpu_memory_utilization": utilization_for_tokens(report, result, tokens, field, asked),
    }
    if changes is not None:
        rest = {k: v for k, v in changes.items() if k != "max_num_seqs"}
        ceiling, reason = seqs_ceiling(report, rest)
        answer["largest_max_num_seqs"] = largest_max_num_seqs(
            report, tokens, what_if, rest, ceiling
        )
        answer["max_num_seqs_ceiling"] = ceiling
        answer["max_num_seqs_ceiling_by"] = reason
    return answer

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
from memest.estimate.kv import kv_page_bytes
from memest.estimate.phases import total_bytes
from memest.schema import RunReport, WhatIf

# vLLM accepts utilizations with any precision; four decimals keep the answer readable and
# never below the need (rounded up).
_UTIL_DECIMALS = 4
MAX_SEQS_LIMIT = 1 << 14


def kv_bytes_for_tokens(report: RunReport, tokens: int) -> int:
    """Bytes of KV cache that hold ``tokens`` tokens: whole blocks of the start's spec."""
    spec = report.kv_cache
    if spec is None:
        raise ReportFormatError(f"report {report.report_id}: kv_cache spec is missing")
    if tokens <= 0:
        raise ConfigError("--kv-tokens", tokens, "must be positive")
    return math.ceil(tokens / spec.block_size) * kv_page_bytes(spec)


def utilization_for_tokens(report: RunReport, result: WhatIf, tokens: int) -> float:
    """The gpu_memory_utilization under which grid G' of ``result`` holds ``tokens`` tokens.

    The non-KV terms at G' are the budget at G' minus the KV budget at G'.
    """
    total = total_bytes(report)
    if result.terms_to is None or result.kv_budget_bytes_to is None:
        raise ReportFormatError(f"report {report.report_id}: the what-if has no terms for G'")
    non_kv = result.terms_to.requested_bytes - result.kv_budget_bytes_to
    need = non_kv + kv_bytes_for_tokens(report, tokens)
    scale = 10**_UTIL_DECIMALS
    util: float = math.ceil(need / total * scale) / scale
    if util > 1:
        raise ConfigError(
            "--kv-tokens", tokens, f"needs {need} B, more than the GPU's {total} B at any grid"
        )
    return util


def largest_max_num_seqs(
    report: RunReport,
    tokens: int,
    what_if: Any,
    changes: Mapping[str, Any] | None = None,
) -> int | None:
    """The largest max_num_seqs (other changes kept) whose KV budget still holds ``tokens``.

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
    while high <= MAX_SEQS_LIMIT and holds(high):
        low, high = high, high * 2
    high = min(high, MAX_SEQS_LIMIT + 1)
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


def concurrency_at(report: RunReport, tokens: int | None) -> float | None:
    """Requests of the start's max_model_len that ``tokens`` KV tokens hold."""
    length = report.config.max_model_len
    if tokens is None or not length:
        return None
    return tokens / length


def inverse_answer(
    report: RunReport,
    result: WhatIf,
    tokens: int,
    changes: Mapping[str, Any] | None,
    what_if: Any,
) -> dict[str, Any]:
    """The answers to "what holds ``tokens`` tokens": the utilization under G' and, for a grid
    written as changes, the largest max_num_seqs that still holds them."""
    answer: dict[str, Any] = {
        "kv_tokens": tokens,
        "gpu_memory_utilization": utilization_for_tokens(report, result, tokens),
    }
    if changes is not None:
        rest = {k: v for k, v in changes.items() if k != "max_num_seqs"}
        answer["largest_max_num_seqs"] = largest_max_num_seqs(report, tokens, what_if, rest)
    return answer

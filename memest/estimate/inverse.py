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
        result = what_if(report, {**base, "max_num_seqs": seqs})
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

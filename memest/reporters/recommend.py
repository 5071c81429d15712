"""The one KV-cache recommendation for a start, as every surface states it."""

from __future__ import annotations

from memest.schema import StartAccounting


def recommended_kv_cache_bytes(accounting: StartAccounting) -> int | None:
    """The bytes of `--kv-cache-memory-bytes` memest recommends for the start's configuration:
    memest's budget for the KV cache (its estimator record); None when it has none."""
    record = accounting.estimator("memest")
    return record.kv_cache_bytes if record is not None else None


def kv_cache_flag(accounting: StartAccounting) -> str | None:
    """The vLLM flag of the recommendation, as `memest estimate --from` prints it."""
    value = recommended_kv_cache_bytes(accounting)
    return f"--kv-cache-memory-bytes={value}" if value else None

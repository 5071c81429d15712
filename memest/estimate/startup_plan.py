"""vLLM startup-plan files (``vllm/v1/worker/startup_plan.py``) written from memest.

vLLM applies ``{VLLM_CACHE_ROOT}/startup_plan/startup_plan_{fingerprint}.json`` when
``VLLM_ENABLE_STARTUP_PLAN=1``, the fingerprint matches, and current free memory is at least
the recorded baseline; it then sets ``kv_cache_memory_bytes`` and skips profiling. The
fingerprint hashes the worker's final VllmConfig, device and build, so only a running worker can
compute it; memest takes it from the report. The file's ``schema`` is the release's
(``memest.vllm_versions``: 1 on vLLM 0.33.0, 2 on 0.34.0; vLLM ignores a plan of another schema).
On vLLM 0.34 with its growable KV cache on, a plan's size is a ceiling: vLLM still commits no
more than its own margin allows after capture (``--no-enable-extensible-kv-cache`` makes the
plan's size the size).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from memest.errors import ConfigError
from memest.schema import EstimateRecord, RunReport
from memest.vllm_versions import VERSIONS, resolve_version

#: The plan-file schema of each supported vLLM release.
PLAN_SCHEMAS: dict[str, int] = {row.version: row.startup_plan_schema for row in VERSIONS}
PLAN_DIRNAME = "startup_plan"
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{16}$")


def startup_plan_dir(cache_root: Path) -> Path:
    """The folder vLLM reads plans from, given ``VLLM_CACHE_ROOT``."""
    return cache_root / PLAN_DIRNAME


def startup_plan_filename(fingerprint: str) -> str:
    return f"startup_plan_{fingerprint}.json"


def _check_int(field: str, value: object, *, positive: bool) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(field, value, "must be an integer number of bytes")
    if positive and value <= 0:
        raise ConfigError(field, value, "must be positive (vLLM ignores a plan without KV bytes)")
    if value < 0:
        raise ConfigError(field, value, "must not be negative")
    return value


def startup_plan_document(
    fingerprint: str,
    kv_cache_memory_bytes: int,
    free_memory_baseline: int,
    *,
    vllm_version: str | None = None,
) -> dict[str, Any]:
    """The plan as vLLM writes it: schema, fingerprint, KV bytes, free-memory baseline.

    ``vllm_version``: the release that reads the plan (its schema); None: the installed one,
    else the newest supported.

    Raises:
        ConfigError: the fingerprint is not 16 lowercase hex digits, a byte count is not a
            positive (KV) or non-negative (baseline) int, or the release is not supported.
    """
    schema = resolve_version(vllm_version).startup_plan_schema
    if not isinstance(fingerprint, str) or not _FINGERPRINT_RE.match(fingerprint):
        raise ConfigError("fingerprint", fingerprint, "expected 16 lowercase hex digits")
    return {
        "schema": schema,
        "fingerprint": fingerprint,
        "kv_cache_memory_bytes": _check_int(
            "kv_cache_memory_bytes", kv_cache_memory_bytes, positive=True
        ),
        "free_memory_baseline": _check_int(
            "free_memory_baseline", free_memory_baseline, positive=False
        ),
    }


def write_startup_plan(directory: Path, document: dict[str, Any], *, replace: bool = True) -> Path:
    """Write ``document`` atomically (temp file + ``os.replace``) as vLLM names it in ``directory``.

    ``directory`` is the plan folder itself (``startup_plan_dir(VLLM_CACHE_ROOT)``); it is created
    if missing. Returns the path written. With ``replace=False`` a plan already there is kept
    (the temp file is linked in, which fails when the name exists).

    Raises:
        ConfigError: the document is not a valid plan.
        FileExistsError: ``replace=False`` and a plan of this fingerprint exists.
        OSError: the folder cannot be written.
    """
    releases = {schema: version for version, schema in PLAN_SCHEMAS.items()}
    schema = document.get("schema")
    if schema not in releases:
        known = ", ".join(f"{s} (vLLM {v})" for s, v in releases.items())
        raise ConfigError("schema", schema, f"expected one of {known}")
    doc = startup_plan_document(
        document.get("fingerprint"),  # type: ignore[arg-type]
        document.get("kv_cache_memory_bytes"),  # type: ignore[arg-type]
        document.get("free_memory_baseline"),  # type: ignore[arg-type]
        vllm_version=releases[schema],
    )
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / startup_plan_filename(doc["fingerprint"])
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".tmp.", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(doc, handle)
        if replace:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def graph_profiling_kept(report: RunReport) -> int:
    """Bytes graph-memory profiling left allocated at the end of init that a plan start, which
    skips that pass, does not allocate: its plan adds them back.

    From the allocator history's retained view when it was recorded, by the stream each block
    was made on (``RetainedRow.stream``, vLLM 0.33.0's code):

    - on the pass's own stream (``graph_capture()`` creates one per call; the first GEMM on it
      keeps cuBLAS's per-stream workspace, Inductor output buffers may stay too): skipped;
    - on a stream that outlives the pass (``aux_stream()``, where the MoE shared experts run
      for up to ``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` tokens): a plan start allocates
      it on that stream's first use, in its warm-up or capture; not skipped;
    - with such a stream, the pass's own stream's first GEMM workspace is not skipped either:
      the shared experts record their event on ``vllm.utils.torch_utils.current_stream()``,
      whose first call outside any stream context (a plan start's warm-up, where graph
      profiling would have set it) creates a dedicated stream for the thread, whose first
      GEMM keeps the same per-stream workspace the side stream kept.

    Without a history, from the pass's readings: the allocated growth over it, of which the
    growth on vLLM's auxiliary stream is the side stream's (``aux_stream_allocated_bytes``,
    where the readings have it; else none is).
    """
    bd = report.breakdown
    if bd is not None and bd.event_count and any(s.phase == "graph_profiling" for s in bd.stages):
        rows = [r for r in bd.retained if r.phase == "graph_profiling"]
        side = sum(r.bytes for r in rows if r.stream == "side")
        own = sum(r.bytes for r in rows if r.stream != "side")
        return max(own - side, 0)
    gp = [p for p in report.phases if p.name == "graph_profiling.total"]
    if not gp:
        return 0
    start, end = gp[-1].start, gp[-1].end
    growth = max(end.torch_allocated_bytes - start.torch_allocated_bytes, 0)
    side = 0
    if start.aux_stream_allocated_bytes is not None and end.aux_stream_allocated_bytes is not None:
        side = max(end.aux_stream_allocated_bytes - start.aux_stream_allocated_bytes, 0)
    return max(growth - 2 * side, 0)  # own (growth - side) less side, as with a history


def plan_kv_bytes(
    *, over_budget_bytes: int, kv_now_bytes: int, page_bytes: int, margin_bytes: int
) -> int:
    """KV bytes for the next start's plan: this start's KV less what it ended over budget.

    ``over_budget_bytes`` is this start's usage minus budget with what graph-memory profiling
    left allocated taken out (a plan start skips that pass); whole blocks only.
    """
    return ((kv_now_bytes - over_budget_bytes - margin_bytes) // page_bytes) * page_bytes


def plan_record(
    *,
    kv_plan_bytes: int,
    page_bytes: int,
    block_size: int,
    usage_minus_budget_bytes: int,
    note: str,
) -> EstimateRecord:
    """The ``memest-plan`` estimate record: the plan's KV and the usage minus budget it predicts."""
    return EstimateRecord(
        estimator="memest-plan",
        kv_cache_bytes=kv_plan_bytes,
        kv_tokens=(kv_plan_bytes // page_bytes) * block_size if page_bytes else None,
        usage_minus_budget_bytes=usage_minus_budget_bytes,
        note=note,
    )

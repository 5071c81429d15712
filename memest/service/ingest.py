"""Reading a report body: JSON only, size-limited, schema-checked, storable without surprises."""

from __future__ import annotations

import json
import math
import multiprocessing
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC
from typing import Any

import anyio
from fastapi import Request
from pydantic import ValidationError

from memest.errors import field_errors
from memest.identity import stored_form
from memest.schema import SCHEMA_VERSION, RunReport
from memest.service.errors import (
    BadRequest,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)
from memest.service.metrics_cache import metric_rows_json
from memest.service.store import MAX_FINGERPRINT_CHARS, MAX_INT64, Prepared, prepare, to_utc

_ID_RE = re.compile(r"^[A-Za-z0-9._:@+-]{1,200}$")
#: Deepest nesting of objects and arrays accepted in a report. Real reports nest less than 10
#: levels; the bound keeps every later parse and render of a stored report far from any
#: recursion limit.
MAX_JSON_DEPTH = 64
#: Errors a refused RunReport names in its one-line detail: enough to fix a hand-edited report
#: in one pass, few enough that a report wrong everywhere still answers a readable line.
_NAMED_ERRORS = 10
#: Seconds a client has to send a whole report body (4 MiB take well under a second on any link
#: a vLLM host has to the service).
BODY_READ_TIMEOUT_S = 30.0
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_WORLD = 1 << 16
#: Longest stored value per indexed column (the table's String lengths).
_LENGTHS = {
    "model": 300,
    "build.label": 200,
    "build.vllm_commit": 64,
    "build.vllm_version": 64,
    "gpu.name": 200,
    "config_fingerprint": MAX_FINGERPRINT_CHARS,
}


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 once it passes ``limit`` bytes (before buffering it all)."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaType(
            f"reports are JSON only: Content-Type must be application/json, got {ctype!r}",
            field="content-type",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"report body is {int(declared)} bytes; the limit is {limit} (MEMEST_MAX_REPORT_BYTES)",
            field="body",
        )
    chunks: list[bytes] = []
    size = 0
    try:
        # One deadline for the whole body: a client trickling bytes cannot hold a connection
        # (and its memory) for longer.
        with anyio.fail_after(BODY_READ_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"report body exceeds {limit} bytes (MEMEST_MAX_REPORT_BYTES)",
                        field="body",
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            f"report body not received within {BODY_READ_TIMEOUT_S:g} s", field="body"
        ) from None
    return b"".join(chunks)


def load_json(body: bytes, field: str = "body") -> Any:
    """Parse JSON text; NaN, Infinity, over-deep nesting, integers past int64 and lone surrogates
    are a 422 naming ``field`` (or the path inside it)."""

    def reject_constant(name: str) -> None:
        raise BadRequest(f"{field} holds {name}: numbers must be finite", field=field)

    try:
        data = json.loads(body, parse_constant=reject_constant)
    except RecursionError:
        raise BadRequest(
            f"{field} is nested deeper than {MAX_JSON_DEPTH} levels", field=field
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers over 4300 digits
        why = "an integer has too many digits" if "digits" in str(exc) else str(exc)
        raise BadRequest(f"{field} is not valid JSON: {why}", field=field) from None
    bad = find_unstorable(data)
    if bad is not None:
        path, why = bad
        path = f"{field}.{path}" if path and field != "body" else path or field
        shown = path if len(path) <= 120 else path[:120] + "..."
        raise BadRequest(f"{shown} {why}", field=shown)
    return data


def find_unstorable(data: Any) -> tuple[str, str] | None:
    """The first value (its dotted path, what is wrong) that a report may not hold: nesting past
    MAX_JSON_DEPTH, an integer outside int64, a non-finite float, a lone surrogate in a string."""
    if _storable(data):
        return None
    return _first_unstorable(data)


def _storable(data: Any) -> bool:
    """True when find_unstorable finds nothing: the same checks without building paths (a valid
    report, the common case, costs one pass over its values and no tuple per value)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH or (depth == MAX_JSON_DEPTH and value):
            return False  # this value, or a child of it, lies deeper than the bound
        if isinstance(value, dict):
            for key, item in value.items():
                if not key.isascii() and _SURROGATE.search(key):
                    return False
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif _scalar_problem(item) is not None:
                    return False
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict | list):
                    stack.append((item, depth + 1))
                elif _scalar_problem(item) is not None:
                    return False
        elif _scalar_problem(value) is not None:
            return False
    return True


def _first_unstorable(data: Any) -> tuple[str, str] | None:
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            return ".".join(path), f"is nested deeper than {MAX_JSON_DEPTH} levels"
        why = _scalar_problem(value)
        if why is not None:
            return ".".join(path), why
        if isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return ".".join(path), "has a key with a lone surrogate (not valid UTF-8)"
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(value))
    return None


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) > MAX_INT64:
        return "does not fit in a signed 64-bit integer"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
        return "holds a lone surrogate (not valid UTF-8)"
    return None


def parse_report(body: bytes) -> RunReport:
    """Validate a JSON body as a RunReport of this schema version; 422 names the field at fault."""
    data = load_json(body)
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object (one RunReport)", field="body")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise BadRequest(
            f"schema_version {version!r} is not supported; this server reads {SCHEMA_VERSION!r}",
            field="schema_version",
        )
    try:
        report = RunReport.model_validate(data)
    except ValidationError as exc:
        problems = field_errors(exc, _NAMED_ERRORS)
        detail = "; ".join(f"{p.field or 'body'}: {p.message}" for p in problems)
        raise BadRequest(
            f"invalid RunReport: {detail}", field=problems[0].field or "body"
        ) from None
    check_storable(report)
    report = stored_form(report)
    if report.created_at.tzinfo is None:
        # Stored and compared as UTC, like every other created_at (naive and aware never mix).
        report = report.model_copy(update={"created_at": report.created_at.replace(tzinfo=UTC)})
    return report


def check_storable(report: RunReport) -> None:
    """Limits the database imposes, checked up front so that storage never fails half-way."""
    for key, ident in (("report_id", report.report_id), ("run_id", report.run_id)):
        if not _ID_RE.match(ident):
            raise BadRequest(
                f"{key} {ident[:80]!r} must be 1-200 characters of A-Z a-z 0-9 . _ : @ + -",
                field=key,
            )
    if report.world_size > _MAX_WORLD:
        raise BadRequest(f"world_size must be at most {_MAX_WORLD}", field="world_size")
    if report.rank >= report.world_size:
        raise BadRequest(
            f"rank {report.rank} is not below world_size {report.world_size}", field="rank"
        )
    values: dict[str, str | None] = {
        "model": report.model,
        "build.label": report.build.label,
        "build.vllm_commit": report.build.vllm_commit,
        "build.vllm_version": report.build.vllm_version,
        "gpu.name": report.gpu.name if report.gpu else None,
        "config_fingerprint": report.config_fingerprint,
    }
    for field, value in values.items():
        if value is None:
            continue
        if len(value) > _LENGTHS[field]:
            raise BadRequest(f"{field} is longer than {_LENGTHS[field]} characters", field=field)
        if "\x00" in value:
            raise BadRequest(f"{field} contains a NUL character", field=field)
    if not report.model.strip():
        raise BadRequest("model must not be empty", field="model")
    to_utc(report.created_at, "created_at")


def prepare_body(body: bytes) -> Prepared:
    """All the CPU work of an ingest (parse, stored form, accounting, /metrics samples): what is
    left is the write transaction. Its 4xx errors are ServiceErrors, which pickle whole."""
    report = parse_report(body)
    return prepare(report, metric_rows_json(report))


class IngestPool:
    """prepare_body in worker processes (MEMEST_INGEST_PROCESSES), so that the CPU work of
    ingest does not hold the server's GIL while pages wait; with 0, in the calling thread.

    Workers are spawned (never forked from the threaded server) on first use."""

    def __init__(self, processes: int) -> None:
        self._processes = processes
        self._lock = threading.Lock()
        self._pool = self._new() if processes else None

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self._processes, mp_context=multiprocessing.get_context("spawn"))

    def prepare(self, body: bytes) -> Prepared:
        """prepare_body(body), in a worker when there are any (called from an ingest thread)."""
        pool = self._pool
        if pool is None:
            return prepare_body(body)
        try:
            return pool.submit(prepare_body, body).result()
        except BrokenProcessPool:
            # A worker died (killed from outside): later reports go to a fresh pool.
            with self._lock:
                if self._pool is pool:
                    self._pool = self._new()
                    pool.shutdown(wait=False, cancel_futures=True)
            return prepare_body(body)

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

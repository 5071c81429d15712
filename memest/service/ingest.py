"""Ingest of a validated report (memest.service.body): storable without surprises, prepared
in worker processes."""

from __future__ import annotations

import multiprocessing
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC

from memest.identity import stored_form
from memest.schema import RunReport
from memest.service.body import parse_body
from memest.service.errors import (
    BadRequest,
)
from memest.service.metrics_cache import metric_rows_json
from memest.service.niceness import lower_priority
from memest.service.store import MAX_FINGERPRINT_CHARS, Prepared, prepare, to_utc

_ID_RE = re.compile(r"^[A-Za-z0-9._:@+-]{1,200}$")
_MAX_WORLD = 1 << 16
#: Longest stored value per indexed column (the table's String lengths).
#: Characters past ASCII that break a line or drive a terminal, refused in a stored name as
#: the ASCII controls are: the C1 controls (NEL U+0085, CSI U+009B, ...) and the Unicode line and
#: paragraph separators (a name is one line in a page, a log and a /metrics label).
_LINE_BREAKS = frozenset(map(chr, range(0x80, 0xA0))) | {"\u2028", "\u2029"}
_LENGTHS = {
    "model": 300,
    "build.label": 200,
    "build.vllm_commit": 64,
    "build.vllm_version": 64,
    "gpu.name": 200,
    "config_fingerprint": MAX_FINGERPRINT_CHARS,
}


def parse_report(body: bytes) -> RunReport:
    """A JSON body as a stored-form RunReport of this schema version; 422 names the field."""
    return finish_report(parse_body(body, RunReport))


def finish_report(report: RunReport) -> RunReport:
    """A validated report as stored: within the database's limits, in its stored form, with a
    UTC created_at."""
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
        if any(ord(c) < 0x20 or c == "\x7f" or c in _LINE_BREAKS for c in value):
            raise BadRequest(f"{field} contains a control character", field=field)
    if not report.model.strip():
        raise BadRequest("model must not be empty", field="model")
    to_utc(report.created_at, "created_at")


def prepare_report(report: RunReport) -> Prepared:
    """All the CPU work of an ingest after validation (stored form, accounting, /metrics
    samples): what is left is the write transaction. Its 4xx errors are ServiceErrors, which
    pickle whole."""
    report = finish_report(report)
    return prepare(report, metric_rows_json(report))


def prepare_body(body: bytes) -> Prepared:
    """prepare_report of a JSON body (parsed with memest.service.body's limits)."""
    return prepare_report(parse_body(body, RunReport))


class IngestPool:
    """prepare_body in worker processes (MEMEST_INGEST_PROCESSES), so that the CPU work of
    ingest does not hold the server's GIL while pages wait; with 0, in the calling thread.

    Workers are spawned (never forked from the threaded server) on first use."""

    def __init__(self, processes: int) -> None:
        self._processes = processes
        self._lock = threading.Lock()
        self._pool = self._new() if processes else None

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self._processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=lower_priority,  # a parse yields a contended core to the event loop
        )

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

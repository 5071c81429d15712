"""Storage operations: ingest one report in one transaction, and the read queries."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from memest.builds.runs import fingerprint
from memest.estimate import account
from memest.identity import model_display_name, stored_form
from memest.schema import RunReport, StartAccounting
from memest.service.db import write_session
from memest.service.errors import BadRequest, Conflict, NotFound
from memest.service.models import Report, Run

IngestStatus = Literal["created", "exists"]
MAX_INT64 = 2**63 - 1
#: Longest configuration fingerprint stored on a run (the column's length).
MAX_FINGERPRINT_CHARS = 200


@dataclass(frozen=True)
class IngestResult:
    status: IngestStatus
    report_id: str
    run_id: str


def canonical_json(report: RunReport) -> str:
    """The stored form of a report: pydantic's JSON of the validated model."""
    return report.model_dump_json()


def _as_utc(value: datetime) -> datetime:
    """Aware UTC; naive values are taken as UTC (SQLite returns stored values naive)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def to_utc(value: datetime, field: str) -> datetime:
    """``value`` in UTC; a 422 naming ``field`` when its offset moves it past year 1 or 9999."""
    try:
        return _as_utc(value)
    except OverflowError:
        raise BadRequest(f"{field} is out of range once converted to UTC", field=field) from None


def _int64(value: int | None, field: str) -> int | None:
    """A figure stored in a BIGINT column; a sum of in-range sizes may still pass int64."""
    if value is not None and abs(value) > MAX_INT64:
        raise BadRequest(f"{field} ({value}) does not fit in a signed 64-bit integer", field=field)
    return value


def _accounting(report: RunReport) -> StartAccounting:
    """The report's accounting, stored; a figure it cannot hold (past int64): 4xx on breakdown."""
    try:
        return account(report)
    except ValueError as exc:  # pydantic's ValidationError: a computed figure out of range
        message = str(exc).splitlines()[0]
        raise BadRequest(
            f"breakdown: a figure computed from it is out of range ({message})", field="breakdown"
        ) from None


def run_fingerprint(report: RunReport) -> str | None:
    """The fingerprint stored on a run led by ``report`` (the history page's); None when the
    column cannot hold it (stored before ingest bounded it): readers take it from the report."""
    value = fingerprint(report)
    if len(value) > MAX_FINGERPRINT_CHARS or "\x00" in value:
        return None
    return value


def _check_run(run: Run, report: Prepared) -> None:
    """A run's reports must agree on what the run is; name the first field that differs."""
    checks = (
        ("model", model_display_name(run.model), report.model),
        ("build.label", run.build_label, report.build_label),
        ("build.vllm_commit", run.vllm_commit, report.vllm_commit),
        ("world_size", run.world_size, report.world_size),
        ("source", run.source, report.source),
    )
    for field, stored, given in checks:
        if stored != given:
            raise Conflict(
                f"run {run.run_id!r} is stored with {field}={stored!r}; this report has {given!r}",
                field=field,
            )


def _same_once_stored(stored: str, payload: str) -> bool:
    """A row stored before path-like models got their folder's name: same report, stored form."""
    try:
        before = RunReport.model_validate_json(stored)
    except ValueError:
        return False
    return canonical_json(stored_form(before)) == payload


@dataclass(frozen=True)
class Prepared:
    """What storing a report needs, computed outside the write transaction (picklable)."""

    report_id: str
    run_id: str
    rank: int
    schema_version: str
    model: str
    build_label: str
    vllm_commit: str | None
    vllm_version: str | None
    gpu_name: str | None
    source: str
    world_size: int
    created_at: datetime
    config_fingerprint: str | None
    payload: str
    graph_pool_bytes: int | None
    kv_tokens: int | None
    metric_rows: str | None


def prepare(report: RunReport, metric_rows: str | None = None) -> Prepared:
    """The CPU work of an ingest; a 422 for an accounting figure out of range."""
    accounting = _accounting(report)
    return Prepared(
        report_id=report.report_id,
        run_id=report.run_id,
        rank=report.rank,
        schema_version=report.schema_version,
        model=report.model,
        build_label=report.build.label,
        vllm_commit=report.build.vllm_commit,
        vllm_version=report.build.vllm_version,
        gpu_name=report.gpu.name if report.gpu else None,
        source=report.source,
        world_size=report.world_size,
        created_at=report.created_at,
        config_fingerprint=run_fingerprint(report),
        payload=canonical_json(report),
        graph_pool_bytes=accounting.graph_pool_bytes,
        kv_tokens=accounting.kv_tokens,
        metric_rows=metric_rows,
    )


def _ingest_once(factory: sessionmaker[Session], report: Prepared) -> IngestResult:
    payload, digest = report.payload, hashlib.sha256(report.payload.encode()).hexdigest()
    now = datetime.now(UTC)

    def repeat(existing: Report) -> IngestResult:
        if existing.payload_sha256 != digest and not _same_once_stored(existing.payload, payload):
            raise Conflict(
                f"report_id {report.report_id!r} is already stored with different content",
                field="report_id",
            )
        return IngestResult("exists", report.report_id, existing.run_id)

    with write_session(factory) as session:
        existing = session.get(Report, report.report_id)
        if existing is not None:
            return repeat(existing)
        run = session.get(Run, report.run_id)
        if run is None:
            run = Run(
                run_id=report.run_id,
                model=report.model,
                build_label=report.build_label,
                vllm_commit=report.vllm_commit,
                vllm_version=report.vllm_version,
                gpu_name=report.gpu_name,
                source=report.source,
                world_size=report.world_size,
                config_fingerprint=report.config_fingerprint,
                created_at=to_utc(report.created_at, "created_at"),
                ingested_at=now,
            )
            session.add(run)
        else:
            _check_run(run, report)
            taken = session.scalar(
                select(Report.report_id).where(
                    Report.run_id == report.run_id, Report.rank == report.rank
                )
            )
            if taken == report.report_id:
                # Committed by a concurrent writer after this transaction's first look.
                row = session.get(Report, taken, populate_existing=True)
                if row is not None:
                    return repeat(row)
            if taken is not None:
                raise Conflict(
                    f"run {report.run_id!r} already has rank {report.rank} (report {taken!r})",
                    field="rank",
                )
            lowest = session.scalar(
                select(func.min(Report.rank)).where(Report.run_id == report.run_id)
            )
            if lowest is None or report.rank < lowest:
                # The run's lead report (lowest rank) changes: so does its fingerprint.
                run.config_fingerprint = report.config_fingerprint
        session.add(
            Report(
                report_id=report.report_id,
                run_id=report.run_id,
                rank=report.rank,
                schema_version=report.schema_version,
                payload=payload,
                payload_sha256=digest,
                size_bytes=len(payload.encode()),
                graph_pool_bytes=_int64(report.graph_pool_bytes, "breakdown"),
                kv_tokens=_int64(report.kv_tokens, "kv_tokens"),
                metric_rows=report.metric_rows,
                ingested_at=now,
            )
        )
        session.flush()
    return IngestResult("created", report.report_id, report.run_id)


def ingest(
    factory: sessionmaker[Session], report: RunReport, metric_rows: str | None = None
) -> IngestResult:
    """Store one report atomically (store_prepared); ``metric_rows`` are its /metrics samples
    (memest.service.metrics_cache.metric_rows_json), so that /metrics never parses the report."""
    return store_prepared(factory, prepare(report, metric_rows))


def store_prepared(factory: sessionmaker[Session], prepared: Prepared) -> IngestResult:
    """Store one report atomically; a repeat of a stored report id is a no-op. A concurrent
    writer of the same run or report id makes the first attempt fail on a unique key; the retry
    then sees the committed row and answers as for a repeat.

    Raises:
        Conflict: same report id with other content, a rank already taken, or run fields differ.
    """
    for attempt in range(3):
        try:
            return _ingest_once(factory, prepared)
        except IntegrityError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def delete_run(factory: sessionmaker[Session], run_id: str) -> list[str]:
    """Delete a run and its reports in one transaction; returns the deleted report ids.

    Raises:
        NotFound: no such run.
    """
    with write_session(factory) as session:
        # FOR UPDATE: of concurrent deletes (PostgreSQL) one finds the row, the rest none (404).
        run = session.scalar(select(Run).where(Run.run_id == run_id).with_for_update())
        if run is None:
            raise NotFound(f"no run {run_id!r}", field="run_id")
        report_ids = list(session.scalars(select(Report.report_id).where(Report.run_id == run_id)))
        session.execute(delete(Report).where(Report.run_id == run_id))
        session.delete(run)
    return report_ids


class ReportCache:
    """Parsed reports by (report id, content digest): a report id deleted and stored again with
    other content is another key, so no read racing a delete or re-post, on this replica or
    another, can be answered with the old content."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str], RunReport] = OrderedDict()
        self._lock = threading.Lock()

    def drop(self, report_ids: list[str]) -> None:
        """Forget deleted reports (a report id may be stored again with other content)."""
        with self._lock:
            gone = set(report_ids)
            for key in [k for k in self._items if k[0] in gone]:
                del self._items[key]

    def get(self, row: Report) -> RunReport:
        key = (row.report_id, row.payload_sha256)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        parsed = RunReport.model_validate_json(row.payload)
        if self._size:
            with self._lock:
                self._items[key] = parsed
                while len(self._items) > self._size:
                    self._items.popitem(last=False)
        return parsed


class ResponseCache:
    """Rendered response bodies by key, for answers that can no longer change (bounded LRU)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[object, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: object) -> bytes | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def drop_run(self, run_id: str) -> None:
        """Forget every body of a deleted run (keys are tuples that start with the run id)."""
        with self._lock:
            for key in [k for k in self._items if isinstance(k, tuple) and k[:1] == (run_id,)]:
                del self._items[key]

    def put(self, key: object, body: bytes) -> None:
        if not self._size:
            return
        with self._lock:
            self._items[key] = body
            while len(self._items) > self._size:
                self._items.popitem(last=False)


@dataclass(frozen=True)
class RunFilter:
    model: str | None = None
    build: str | None = None
    commit: str | None = None
    gpu: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    source: str | None = None


def list_runs(
    session: Session, flt: RunFilter, *, limit: int, offset: int
) -> tuple[list[Run], int]:
    """Runs matching ``flt``, newest first, with the total count before paging."""
    stmt = select(Run)
    if flt.model is not None:
        stmt = stmt.where(Run.model == flt.model)
    if flt.build is not None:
        stmt = stmt.where(Run.build_label == flt.build)
    if flt.commit is not None:
        stmt = stmt.where(Run.vllm_commit.startswith(flt.commit, autoescape=True))
    if flt.gpu is not None:
        stmt = stmt.where(Run.gpu_name == flt.gpu)
    if flt.source is not None:
        stmt = stmt.where(Run.source == flt.source)
    if flt.since is not None:
        stmt = stmt.where(Run.created_at >= to_utc(flt.since, "since"))
    if flt.until is not None:
        stmt = stmt.where(Run.created_at <= to_utc(flt.until, "until"))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    rows = session.scalars(
        stmt.order_by(Run.created_at.desc(), Run.run_id).limit(limit).offset(offset)
    ).all()
    return list(rows), total


def ranks_by_run(session: Session, run_ids: list[str]) -> dict[str, list[int]]:
    """Stored ranks of each run, in one query."""
    out: dict[str, list[int]] = {r: [] for r in run_ids}
    if not run_ids:
        return out
    rows = session.execute(
        select(Report.run_id, Report.rank)
        .where(Report.run_id.in_(run_ids))
        .order_by(Report.run_id, Report.rank)
    ).all()
    for run_id, rank in rows:
        out[run_id].append(rank)
    return out


def get_run(session: Session, run_id: str) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}", field="run_id")
    return run


def run_reports(session: Session, run_id: str) -> list[Report]:
    return list(
        session.scalars(select(Report).where(Report.run_id == run_id).order_by(Report.rank)).all()
    )


def report_keys(session: Session, run_id: str) -> list[tuple[str, int, str]]:
    """(report id, rank, content digest) of a run's reports by rank, without their payloads."""
    rows = session.execute(
        select(Report.report_id, Report.rank, Report.payload_sha256)
        .where(Report.run_id == run_id)
        .order_by(Report.rank)
    ).all()
    return [(report_id, rank, digest) for report_id, rank, digest in rows]


def lead_report(session: Session, run_id: str) -> Report:
    """The lowest-rank report of a run (rank 0 when present)."""
    row = session.scalars(
        select(Report).where(Report.run_id == run_id).order_by(Report.rank).limit(1)
    ).first()
    if row is None:
        raise NotFound(f"no run {run_id!r}", field="run_id")
    return row


#: Run ids per IN (...) list: far below every driver's limit on bound parameters.
_IN_CHUNK = 500


@dataclass(frozen=True)
class ModelRow:
    model: str
    runs: int
    builds: list[str]
    latest_run_id: str
    latest_created_at: datetime


def list_models(
    session: Session, *, limit: int | None = None, offset: int = 0
) -> tuple[list[ModelRow], int]:
    """Models by name, ``limit`` of them from ``offset`` (all when None), with the number of
    models stored. Only the page's models' runs are read."""
    total = session.scalar(select(func.count(func.distinct(Run.model)))) or 0
    names = select(Run.model).group_by(Run.model).order_by(Run.model).offset(offset)
    if limit is not None:
        names = names.limit(limit)
    page = list(session.scalars(names).all())
    rows: list[Any] = []  # (model, run id, build label, created at)
    for start in range(0, len(page), _IN_CHUNK):
        stmt = (
            select(Run.model, Run.run_id, Run.build_label, Run.created_at)
            .where(Run.model.in_(page[start : start + _IN_CHUNK]))
            .order_by(Run.model, Run.created_at, Run.run_id)
        )
        rows.extend(session.execute(stmt).all())
    out: dict[str, ModelRow] = {}
    builds: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for model, run_id, build, created in rows:
        counts[model] = counts.get(model, 0) + 1
        seen = builds.setdefault(model, [])
        if build not in seen:
            seen.append(build)
        out[model] = ModelRow(model, counts[model], seen, run_id, _as_utc(created))
    return [out[name] for name in page if name in out], total


def model_runs(session: Session, model: str) -> list[Run]:
    runs = session.scalars(
        select(Run).where(Run.model == model).order_by(Run.created_at, Run.run_id)
    ).all()
    if not runs:
        raise NotFound(f"no runs of model {model!r}", field="model")
    return list(runs)


def runs_oldest_first(
    session: Session, parse: Callable[[Report], RunReport]
) -> list[tuple[str, str, str, str]]:
    """Every run, oldest first: its run id, model, build label and configuration fingerprint.

    The fingerprint is the one stored on the run (no report is parsed to group runs); a run
    stored without one gets it from its lead report, computed the same way.
    """
    # Through the connection: plain rows, without the ORM's per-row work (30,000 runs in a fleet).
    rows = (
        session.connection()
        .execute(
            select(Run.run_id, Run.model, Run.build_label, Run.config_fingerprint).order_by(
                Run.created_at, Run.run_id
            )
        )
        .all()
    )
    out = []
    for run_id, model, build, stored in rows:
        fp = stored
        if fp is None:
            try:
                fp = fingerprint(parse(lead_report(session, run_id)))
            except NotFound:
                continue
        out.append((run_id, model, build, fp))
    return out


def latest_runs(session: Session, parse: Callable[[Report], RunReport]) -> list[tuple[str, str]]:
    """The newest run of every (model, build label, configuration fingerprint), oldest first:
    its run id and fingerprint."""
    latest: dict[tuple[str, str, str], str] = {}
    for run_id, model, build, fp in runs_oldest_first(session, parse):
        key = (model, build, fp)
        latest.pop(key, None)  # re-inserted last: the dict stays in order of each key's newest
        latest[key] = run_id
    return [(run_id, fp) for (_, _, fp), run_id in latest.items()]


def latest_per_config(
    session: Session, parse: Callable[[Report], RunReport]
) -> list[tuple[RunReport, str]]:
    """The lead report and fingerprint of every run latest_runs names, oldest first."""
    out = []
    for run_id, fp in latest_runs(session, parse):
        try:
            lead = lead_report(session, run_id)
        except NotFound:
            continue
        out.append((parse(lead), fp))
    return out


def lead_metric_rows(session: Session, run_ids: list[str]) -> dict[str, str | None]:
    """Each run's lead report's stored metric rows (None where stored without them), read without
    the report payloads; a run with no report left is absent."""
    out: dict[str, tuple[int, str | None]] = {}
    for start in range(0, len(run_ids), _IN_CHUNK):
        chunk = run_ids[start : start + _IN_CHUNK]
        rows = session.execute(
            select(Report.run_id, Report.rank, Report.metric_rows).where(Report.run_id.in_(chunk))
        ).all()
        for run_id, rank, stored in rows:
            if run_id not in out or rank < out[run_id][0]:
                out[run_id] = (rank, stored)
    return {run_id: stored for run_id, (_, stored) in out.items()}


def lead_keys(session: Session, run_ids: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """Each run's lead (lowest-rank) report id, with its run's ingest time: a report id stored
    again with other content belongs to a run deleted and stored again, so the pair names
    one content. Of every run, or of ``run_ids``. Reads only columns stored ahead of the
    payload (SQLite then never reads a report's payload pages) and the runs' small rows."""
    best: dict[str, tuple[int, str]] = {}
    stored_at: dict[str, Any] = {}
    connection = session.connection()  # plain rows, without the ORM's per-row work
    reports = select(Report.run_id, Report.rank, Report.report_id)
    runs = select(Run.run_id, Run.ingested_at)
    chunks: list[list[str] | None] = [None] if run_ids is None else [*_chunks(run_ids)]
    for chunk in chunks:
        where_reports = reports if chunk is None else reports.where(Report.run_id.in_(chunk))
        for run_id, rank, report_id in connection.execute(where_reports):
            if run_id not in best or rank < best[run_id][0]:
                best[run_id] = (rank, report_id)
        where_runs = runs if chunk is None else runs.where(Run.run_id.in_(chunk))
        stored_at.update({run_id: at for run_id, at in connection.execute(where_runs)})
    return {
        run_id: (report_id, str(stored_at[run_id]))
        for run_id, (_, report_id) in best.items()
        if run_id in stored_at
    }


def _chunks(run_ids: list[str]) -> list[list[str]]:
    return [run_ids[start : start + _IN_CHUNK] for start in range(0, len(run_ids), _IN_CHUNK)]


def run_times(session: Session, since: datetime | None = None) -> list[tuple[str, Any, Any]]:
    """(run id, created at, ingested at) of every run, or of those ingested at or after
    ``since``, as the database returns them (compared only with each other)."""
    stmt = select(Run.run_id, Run.created_at, Run.ingested_at)
    if since is not None:
        stmt = stmt.where(Run.ingested_at >= since)
    return [tuple(row) for row in session.connection().execute(stmt)]  # type: ignore[misc]


def report_count(session: Session, run_ids: list[str]) -> int:
    """How many reports the runs ``run_ids`` hold."""
    total = 0
    for chunk in _chunks(run_ids):
        total += (
            session.scalar(select(func.count(Report.run_id)).where(Report.run_id.in_(chunk))) or 0
        )
    return total


def stored_state(session: Session) -> tuple[int, int, str]:
    """What changes whenever a report is stored or a run deleted, on any replica: the number of
    runs and of reports, and the newest run's ingest time. A new run raises the time; a report
    added to a stored run raises the report count; a delete without a new run lowers the run
    count. Cached answers derived from all stored reports are keyed by it. Read from indexes
    and the runs' small rows only, never the reports' (a full scan of those reads every
    payload on SQLite)."""
    runs, newest = session.execute(select(func.count(), func.max(Run.ingested_at))).one()
    reports = session.scalar(select(func.count(Report.run_id))) or 0
    return runs or 0, reports, str(newest)

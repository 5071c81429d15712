"""/metrics for a fleet: each report's samples computed once at ingest and stored; the stored
reports' exposition cached and rebuilt only when the stored reports change.

The series themselves are defined once, in memest.service.metrics (the builder): a report's
samples are what the builder yields for that report alone, so every family it gains appears
here without a change. Here they are written as the exposition: each series set's labels once,
on memest_run_info, and each value series labelled ``model`` and ``key`` (metrics.series_key);
the fleet's families, or every family with ``detail``. The cache is keyed by
memest.service.store.stored_state, read from the database on each scrape, so every replica on
one database rebuilds after any replica's ingest or delete. A report stored before its samples
were (NULL metric_rows) is parsed when its set is first read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from prometheus_client.utils import floatToGoString
from sqlalchemy.orm import Session, sessionmaker

from memest.builds.runs import fingerprint
from memest.schema import RunReport
from memest.service import store
from memest.service.db import read_session
from memest.service.metrics import (
    FLEET_FAMILIES,
    KEY_LABEL,
    OWNER_INFO,
    RUN_INFO,
    STORED_LABELS,
    _StoredReports,
    series_key,
)
from memest.service.models import Report

#: One sample: family name, sample name, labels, value.
Sample = tuple[str, str, dict[str, str], float]


def metric_rows(report: RunReport) -> list[Sample]:
    """The samples the builder exports for ``report`` as the newest run of its configuration."""
    builder = _StoredReports(lambda: [(report, fingerprint(report))])
    return [
        (family.name, s.name, dict(s.labels), float(s.value))
        for family in builder.collect()
        for s in family.samples
    ]


def metric_rows_json(report: RunReport) -> str | None:
    """metric_rows as stored at ingest; None when the builder cannot read the report (a scrape
    then computes them, and fails the same way it always did)."""
    try:
        return json.dumps(metric_rows(report))
    except Exception:  # the builder's own failure; the ingest itself must not fail on it
        return None


def _families_help() -> dict[str, str]:
    """Each family of the exposition, in its order, with its # HELP and # TYPE lines:
    memest_run_info, the fleet's families, the builder's others, memest_owner_info."""
    docs = {family.name: family.documentation for family in _StoredReports(list).collect()}
    order = [RUN_INFO, *FLEET_FAMILIES]
    order += [name for name in docs if name not in order]
    docs[RUN_INFO] = (
        "1 per exported series set: its model, build, configuration fingerprint, mode, who "
        "sized the KV cache, and the key its value series carry beside model"
    )
    docs[OWNER_INFO] = "1 per graph-pool owner exported: owner_id and what it is in words"
    return {
        name: f"# HELP {name} {docs[name]}\n# TYPE {name} gauge\n" for name in [*order, OWNER_INFO]
    }


#: prometheus_client's number syntax (Go's), typed here: the library leaves it unannotated.
_go_number = cast(Callable[[float], str], floatToGoString)


def _number(value: float) -> str:
    """A whole number of bytes or tokens as an integer (fewer bytes than Go's 1.2e+11 form, and
    read the same by Prometheus), anything else as prometheus_client writes it."""
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return _go_number(value)


def _escape(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value  # nearly every value: one scan each instead of three copies
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(name: str, labels: dict[str, str], value: float) -> str:
    """One line of the text format (labels sorted by name, values escaped)."""
    inner = ",".join([f'{key}="{_escape(labels[key])}"' for key in sorted(labels)])
    return f"{name}{{{inner}}} {_number(value)}\n"


def _series_set(samples: list[Sample]) -> tuple[str, ...] | None:
    """The labels every series of a run carries (memest.service.metrics.STORED_LABELS: the
    builder's key for "the same series set"); None for a run with no sample carrying them."""
    for _, _, labels, _ in samples:
        if "model" in labels:
            return tuple(labels.get(name, "") for name in STORED_LABELS)
    return None


#: A run's samples as read: the stored JSON text, or parsed from its report.
_Stored = str | list[Sample]

_DECODER = json.JSONDecoder()


def _first_set(text: str) -> tuple[str, ...] | None:
    """_series_set of stored samples (JSON), decoding them only up to the first sample that
    carries the set's labels: most runs of a fleet are never exported, only placed."""
    end = len(text)
    at = text.index("[") + 1
    while True:
        while at < end and text[at] in " \t\r\n,":
            at += 1
        if at >= end or text[at] == "]":
            return None
        sample, at = _DECODER.raw_decode(text, at)
        labels = sample[2]
        if "model" in labels:
            return tuple(labels.get(name, "") for name in STORED_LABELS)


#: The builder's labels the value series leave to the info lines.
_ON_INFO = frozenset([*STORED_LABELS[1:], "owner"])


@dataclass(frozen=True)
class _RunLines:
    """One exported run's lines by family, and its owners in words."""

    families: dict[str, str]
    owners: dict[str, str]


def _render(samples: list[Sample]) -> _RunLines:
    """One run's lines: its memest_run_info line, and each sample labelled ``model``, ``key``
    and what tells it from the set's other series of its family (stage, owner_id, estimator).
    Written directly, since prometheus_client's registry walk costs five times as much for a
    fleet's samples; the builder's names and label names are plain Prometheus names."""
    labels = _series_set(samples)
    families: dict[str, str] = {}
    owners: dict[str, str] = {}
    key: dict[str, str] = {}
    only_key = ""  # the labels of a sample labelled by its set alone, written once per run
    if labels is not None:
        key = {"model": labels[0], KEY_LABEL: series_key(labels)}
        families[RUN_INFO] = _line(
            RUN_INFO, {**dict(zip(STORED_LABELS, labels, strict=True)), **key}, 1
        )
        only_key = _line("", key, 0).rsplit(" ", 1)[0]
    for family, name, sample, value in samples:
        if "owner_id" in sample and "owner" in sample:
            owners[sample["owner_id"]] = sample["owner"]
        if only_key and all(k in _ON_INFO or k == "model" for k in sample):
            line = f"{name}{only_key} {_number(value)}\n"
        else:
            kept = {k: v for k, v in sample.items() if k not in _ON_INFO}
            line = _line(name, {**kept, **key}, value)
        families[family] = families.get(family, "") + line
    return _RunLines(families, owners)


#: gzip level of the cached exposition: level 1 packs a fleet's text about as small as 6 does
#: (the lines differ in a few digits) in a third of the time, paid on every change.
GZIP_LEVEL = 1


@dataclass
class _Packed:
    """One variant of the exposition (fleet or detail): its text and, once asked for, that text
    gzipped up to a sync point with the compressor to finish it (each scrape appends its own
    counters, compressing only those)."""

    text: bytes
    gzipped: tuple[bytes, Any] | None = None


#: How far back a scrape looks for runs it has not seen: a run's ingest time is taken before its
#: write commits, so under concurrent writers a run can appear after a newer one was seen.
LATE = timedelta(minutes=2)

#: After a DELETE on this replica, every scrape for this long waits for the current state (a
#: delete, or the same ids stored again, is never answered from a build older than the request).
STRICT_AFTER_DELETE_S = 120.0

#: The background refresh keeps the exposition current only while someone scrapes it.
ACTIVE_S = 600.0

#: A run's place in "newest first": its creation time, then its id (store.runs_oldest_first).
_Order = tuple[Any, str]

log = logging.getLogger("memest.service")


@dataclass
class _Snapshot:
    """One finished build: the stored state it was built from, when that state was read
    (time.monotonic), the exported runs' lines oldest first, and each variant once asked for.
    Never changed once published, except for its variants, made under the cache's lock."""

    state: tuple[int, int, str]
    read_at: float
    runs: list[_RunLines]
    packed: dict[bool, _Packed]


class MetricsCache:
    """The stored reports' exposition, kept up to date incrementally.

    Each run's lines are rendered once, keyed by its lead report (its id and its run's ingest
    time, store.lead_keys), and the newest run of each series set exported. After an ingest (on
    any replica) a build reads only the runs ingested since the last one it saw, and checks the
    stored counts of runs and reports against what it knows plus those: anything else (a
    delete, a run stored again, a report added to an older run, a write that committed late)
    rebuilds from every run's ids (no payloads), rendering only runs it has not seen. The text of
    each variant, and its gzip, are made at most once per build.

    A scrape is answered from the last build when its stored state is still the current one.
    While writes are in progress on this replica (``writing``), it is also answered from a build
    whose state was read at most ``max_stale_s`` seconds before it arrived (a build of the
    current state is then started in the background, and ``start`` keeps one running every
    ``max_stale_s / 2`` seconds while the exposition is scraped), so a scrape never waits for
    a build under a stream of reports. Otherwise it waits for a build from a state read after
    it arrived: with no write in progress, with ``max_stale_s`` 0, and for
    STRICT_AFTER_DELETE_S after a DELETE on this replica (``deleted``).
    """

    def __init__(
        self,
        factory: sessionmaker[Session],
        parse: Callable[[Report], RunReport],
        max_stale_s: float = 0.0,
    ) -> None:
        self._factory = factory
        self._parse = parse
        self._max_stale_s = max_stale_s
        self._lock = threading.Lock()  # the published snapshot, its variants, the markers
        self._build_lock = threading.Lock()  # one build at a time; it owns the fields below
        self._snapshot: _Snapshot | None = None
        self._deleted_at: float | None = None
        self._writes = 0  # writes in progress on this replica
        self._scraped_at: float | None = None
        self._wanted: set[bool] = set()
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self._published = threading.Event()
        self._refresher: threading.Thread | None = None
        self._state: tuple[int, int, str] | None = None
        self._help = _families_help()
        self._sets: dict[tuple[str, str], object] = {}  # lead -> its series set's labels
        self._runs: dict[tuple[str, str], _RunLines] = {}  # lead -> lines, of exported runs
        self._known: dict[str, Any] = {}  # run id -> its ingest time
        self._since: Any = None  # the newest ingest time known
        self._newest: dict[object, tuple[_Order, tuple[str, str], str]] = {}  # set -> its run

    def exposition(self, detail: bool = False) -> bytes:
        """The text of every stored series (with ``detail``, of every family); one cheap query
        when nothing changed."""
        snapshot = self._current(detail)
        with self._lock:
            return self._variant(snapshot, detail).text

    def gzipped(self, tail: bytes, detail: bool = False) -> bytes:
        """exposition(detail) followed by ``tail``, gzipped: the exposition compressed once per
        build, ``tail`` (the ingest counters) on each call."""
        snapshot = self._current(detail)
        with self._lock:
            head, packer = self._gzip(self._variant(snapshot, detail))
            finish = packer.copy()
        return bytes(head + finish.compress(tail) + finish.flush())

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Around a write on this replica: while one is in progress, a scrape may be answered
        from a build up to ``max_stale_s`` old (the writes arriving make any answer a moment
        old); with none, it waits for the current state, so a scrape after a write sees it."""
        with self._lock:
            self._writes += 1
        try:
            yield
        finally:
            with self._lock:
                self._writes -= 1

    def deleted(self) -> None:
        """A run was deleted on this replica: scrapes wait for the current state for a while."""
        with self._lock:
            self._deleted_at = time.monotonic()

    def start(self) -> None:
        """Build in the background now (a server just started: the first scrape waits only for
        what is left of it), then, with ``max_stale_s``, keep the build current while scraped."""
        if self._refresher is not None:
            return
        self._stop.clear()
        self._refresher = threading.Thread(target=self._refresh, name="memest-metrics", daemon=True)
        self._refresher.start()

    def wait_built(self, timeout: float | None = None) -> bool:
        """Whether a build has been published (waiting up to ``timeout`` seconds for one)."""
        return self._published.wait(timeout)

    def stop(self) -> None:
        """End the background refresh (waits for a build in progress)."""
        self._stop.set()
        for thread in (self._refresher, self._worker):
            if thread is not None:
                thread.join()
        self._refresher = None

    def _refresh(self) -> None:
        self._build_logged(None)
        if self._max_stale_s <= 0:
            return
        while not self._stop.wait(self._max_stale_s / 2):
            with self._lock:
                scraped = self._scraped_at
            if scraped is not None and time.monotonic() - scraped < ACTIVE_S:
                self._build_logged(None)

    def _build_logged(self, after: float | None) -> None:
        """A background build; its failure (a database gone) is logged, and the next scrape
        meets it again."""
        try:
            self._build(after)
        except Exception:
            log.exception("building /metrics in the background failed")

    def _current(self, detail: bool) -> _Snapshot:
        """A snapshot fit to answer a scrape that arrives now (see the class)."""
        arrived = time.monotonic()
        with self._factory() as session:
            state = store.stored_state(session)
        with self._lock:
            self._wanted.add(detail)
            self._scraped_at = arrived
            strict = (
                self._max_stale_s <= 0
                or self._writes == 0
                or (
                    self._deleted_at is not None
                    and arrived - self._deleted_at < STRICT_AFTER_DELETE_S
                )
            )
            after = arrived if strict else arrived - self._max_stale_s
            snapshot = self._snapshot
            if snapshot is not None and snapshot.state == state:
                return snapshot
            if snapshot is not None and snapshot.read_at >= after:
                if self._worker is None or not self._worker.is_alive():
                    self._worker = threading.Thread(
                        target=self._build_logged, args=(None,), daemon=True
                    )
                    self._worker.start()
                return snapshot
        return self._build(after)

    def _build(self, after: float | None) -> _Snapshot:
        """Bring the cache to the current stored state, unless a snapshot whose state was read
        at or after ``after`` was published meanwhile; publish and return it."""
        with self._build_lock:
            with self._lock:
                snapshot = self._snapshot
            if snapshot is not None and after is not None and snapshot.read_at >= after:
                return snapshot
            # One view of the database for the whole build, so the stored counts agree with
            # the runs read after them while writers commit.
            with read_session(self._factory) as session:
                read_at = time.monotonic()
                state = store.stored_state(session)
                if snapshot is not None and snapshot.state == state:
                    snapshot = _Snapshot(state, read_at, snapshot.runs, dict(snapshot.packed))
                else:
                    if not self._grow(session, state):
                        self._rebuild(session)
                    self._state = state
                    held = sorted(self._newest.values(), key=lambda entry: entry[0])
                    runs = [self._runs[lead] for _, lead, _ in held if lead in self._runs]
                    snapshot = _Snapshot(state, read_at, runs, {})
            with self._lock:
                wanted = set(self._wanted)
            for detail in wanted:  # made here, off the scrapes' path
                if detail not in snapshot.packed:
                    packed = _Packed(self._join(snapshot.runs, detail))
                    self._gzip(packed)
                    snapshot.packed[detail] = packed
            with self._lock:
                self._snapshot = snapshot
            self._published.set()
            return snapshot

    def _variant(self, snapshot: _Snapshot, detail: bool) -> _Packed:
        """The snapshot's text of one variant (made now if never asked for); under _lock."""
        if detail not in snapshot.packed:
            snapshot.packed[detail] = _Packed(self._join(snapshot.runs, detail))
        return snapshot.packed[detail]

    @staticmethod
    def _gzip(packed: _Packed) -> tuple[bytes, Any]:
        if packed.gzipped is None:
            packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 31: gzip framing
            head = packer.compress(packed.text) + packer.flush(zlib.Z_SYNC_FLUSH)
            packed.gzipped = (head, packer)
        return packed.gzipped

    def _grow(self, session: Session, state: tuple[int, int, str]) -> bool:
        """Add the runs ingested since the last build; False when the stored counts say more
        than that changed (then only a rebuild is right)."""
        if self._state is None or self._since is None:
            return False
        new = [
            (run_id, created, ingested)
            for run_id, created, ingested in store.run_times(session, since=self._since - LATE)
            if self._known.get(run_id) != ingested
        ]
        if any(run_id in self._known for run_id, _, _ in new):
            return False  # deleted and stored again
        ids = [run_id for run_id, _, _ in new]
        if state[0] != self._state[0] + len(new):
            return False
        if state[1] != self._state[1] + store.report_count(session, ids):
            return False
        leads = store.lead_keys(session, ids)
        placed = [
            (run_id, (created, run_id), leads[run_id])
            for run_id, created, _ in new
            if run_id in leads
        ]
        fresh = self._learn(session, placed)
        for run_id, order, lead in placed:
            self._place(run_id, order, lead)
        self._render_exported(session, fresh)
        for run_id, _, ingested in new:
            self._known[run_id] = ingested
            self._since = max(self._since, ingested)
        return True

    def _rebuild(self, session: Session) -> None:
        # Every run, oldest first: the newest run per series set wins, and the labels name the
        # configuration and who sized its KV cache, so an enable and an apply start of one
        # configuration stay two sets (memest.service.metrics.STORED_LABELS).
        times = store.run_times(session)
        leads = store.lead_keys(session)
        placed = [
            (run_id, (created, run_id), leads[run_id])
            for run_id, created, _ in times
            if run_id in leads
        ]
        kept = {lead for _, _, lead in placed}
        self._sets = {lead: labels for lead, labels in self._sets.items() if lead in kept}
        fresh = self._learn(session, placed)
        self._newest = {}
        for run_id, order, lead in placed:
            self._place(run_id, order, lead)
        self._render_exported(session, fresh)
        self._known = {run_id: ingested for run_id, _, ingested in times}
        self._since = max(self._known.values(), default=None)

    def _learn(
        self, session: Session, placed: list[tuple[str, _Order, tuple[str, str]]]
    ) -> dict[tuple[str, str], _Stored]:
        """Read the series set of each run not seen before; their samples, by lead, so the
        exported ones are rendered without reading them again."""
        new = [(run_id, lead) for run_id, _, lead in placed if lead not in self._sets]
        fresh = self._read(session, new)
        for lead, stored in fresh.items():
            labels = _first_set(stored) if isinstance(stored, str) else _series_set(stored)
            self._sets[lead] = labels or lead
        return fresh

    def _place(self, run_id: str, order: _Order, lead: tuple[str, str]) -> None:
        """Export a run unless its series set has a newer one (the builder's rule)."""
        labels = self._sets.get(lead)
        if labels is None:
            return  # deleted since the first query
        held = self._newest.get(labels)
        if held is None or order > held[0]:
            self._newest[labels] = (order, lead, run_id)

    def _render_exported(self, session: Session, fresh: dict[tuple[str, str], _Stored]) -> None:
        """Lines for every exported run (only those: a fleet keeps three runs of a set), reading
        again the samples of a run exported once more after a delete."""
        exported = {lead: run_id for _, lead, run_id in self._newest.values()}
        self._runs = {lead: run for lead, run in self._runs.items() if lead in exported}
        missing = [(r, lead) for lead, r in exported.items() if lead not in self._runs]
        fresh.update(self._read(session, [(r, lead) for r, lead in missing if lead not in fresh]))
        for _, lead in missing:
            if lead in fresh:
                stored = fresh[lead]
                self._runs[lead] = _render(
                    json.loads(stored) if isinstance(stored, str) else stored
                )

    def _read(
        self, session: Session, runs: list[tuple[str, tuple[str, str]]]
    ) -> dict[tuple[str, str], _Stored]:
        """The stored samples of each run, by lead, as stored (decoded when rendered); a report
        stored without them is parsed."""
        stored = store.lead_metric_rows(session, [run_id for run_id, _ in runs])
        out: dict[tuple[str, str], _Stored] = {}
        for run_id, lead in runs:
            if run_id not in stored:
                continue  # deleted since the first query
            text = stored[run_id]
            if text is None:
                out[lead] = metric_rows(self._parse(store.lead_report(session, run_id)))
            else:
                out[lead] = text  # JSON: [family, name, labels, value] lists
        return out

    def _join(self, runs: list[_RunLines], detail: bool) -> bytes:
        parts = []
        for family, header in self._help.items():
            if not detail and family not in _FLEET:
                continue
            parts.append(header)
            if family == OWNER_INFO:
                owners: dict[str, str] = {}
                for run in runs:  # oldest first: the newest run's words win
                    owners.update(run.owners)
                parts.extend(
                    _line(OWNER_INFO, {"owner": words, "owner_id": owner}, 1)
                    for owner, words in sorted(owners.items())
                )
            else:
                parts.extend(run.families.get(family, "") for run in runs)
        return "".join(parts).encode()


#: The families of a scrape without ``detail``.
_FLEET = frozenset([RUN_INFO, *FLEET_FAMILIES])

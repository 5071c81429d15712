"""/metrics for a fleet: each report's samples computed once at ingest and stored; the stored
reports' exposition cached and rebuilt only when the stored reports change.

The series themselves are defined once, in memest.service.metrics (the builder): a report's
samples are what the builder yields for that report alone, so every family it gains appears
here without a change. The cache is keyed by memest.service.store.stored_state, read from the
database on each scrape, so every replica on one database rebuilds after any replica's ingest
or delete. A report stored before its samples were (NULL metric_rows) is parsed once per
rebuild.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from sqlalchemy.orm import Session, sessionmaker

from memest.builds.runs import fingerprint
from memest.schema import RunReport
from memest.service import store
from memest.service.metrics import STORED_LABELS, _StoredReports
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


class _Families(Collector):
    """The builder's families (names, help, types) filled with given samples."""

    def __init__(self, samples: list[Sample]) -> None:
        self._samples = samples

    def collect(self) -> Iterator[Metric]:
        families = {}
        for empty in _StoredReports(list).collect():
            families[empty.name] = Metric(empty.name, empty.documentation, empty.type)
        for family, name, labels, value in self._samples:
            if family in families:
                families[family].add_sample(name, labels, value)
        yield from families.values()


def _headers() -> dict[str, str]:
    """Each of the builder's families (in the builder's order): its # HELP and # TYPE lines."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([]))
    out: dict[str, str] = {}
    for line in generate_latest(registry).decode().splitlines(keepends=True):
        family = line.split(" ", 3)[2]
        out[family] = out.get(family, "") + line
    return out


#: One rendered sample: its family, and its line of the exposition.
_Line = tuple[str, str]


#: prometheus_client's number syntax (Go's), typed here: the library leaves it unannotated.
_number = cast(Callable[[float], str], floatToGoString)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _render(samples: list[Sample]) -> list[_Line]:
    """Each sample's exposition line, in the order given: the text format prometheus_client's
    generate_latest writes (labels sorted by name, values escaped, Go float syntax), written
    directly, since its registry walk costs five times as much for a fleet's 90,000 samples.
    The builder's names and label names are plain Prometheus names, which it leaves as they are."""
    out = []
    for family, name, labels, value in samples:
        inner = ",".join(f'{key}="{_escape(labels[key])}"' for key in sorted(labels))
        series = f"{name}{{{inner}}}" if inner else name
        out.append((family, f"{series} {_number(value)}\n"))
    return out


def _series_set(samples: list[Sample]) -> tuple[str, ...] | None:
    """The labels every series of a run carries (memest.service.metrics.STORED_LABELS: the
    builder's key for "the same series set"); None for a run with no sample carrying them."""
    for _, _, labels, _ in samples:
        if "model" in labels:
            return tuple(labels.get(name, "") for name in STORED_LABELS)
    return None


@dataclass(frozen=True)
class _RunLines:
    """One exported run's lines, by family, and the labels that name its series set."""

    labels: object
    families: dict[str, str]


class MetricsCache:
    """The stored reports' exposition, kept up to date incrementally.

    Each exported run's lines are rendered once, keyed by its lead report (its id and its run's
    ingest time, store.lead_keys), and kept while that run is exported: after an ingest or delete (on any replica)
    a rebuild reads which runs are exported and the lead report of each (ids only, no
    payloads), renders only the runs it has not rendered before, and joins the lines. So a
    scrape after one ingest costs two index-only queries and a join, not a pass over every
    stored report's samples.
    """

    def __init__(
        self, factory: sessionmaker[Session], parse: Callable[[Report], RunReport]
    ) -> None:
        self._factory = factory
        self._parse = parse
        self._lock = threading.Lock()
        self._state: tuple[int, int, str] | None = None
        self._text = b""
        self._headers = _headers()
        self._runs: dict[tuple[str, str], _RunLines] = {}

    def exposition(self) -> bytes:
        """The text of every stored series; one cheap query when nothing changed."""
        with self._factory() as session:
            state = store.stored_state(session)
            with self._lock:  # one rebuild at a time; scrapes that wait then find it built
                if state != self._state:
                    self._text = self._build(session)
                    self._state = state
                return self._text

    def _build(self, session: Session) -> bytes:
        # Every run, oldest first: the newest run per series set wins below, and the labels name
        # the configuration and who sized its KV cache, so an enable and an apply start of one
        # configuration stay two series (memest.service.metrics.STORED_LABELS).
        latest = [run[0] for run in store.runs_oldest_first(session, self._parse)]
        leads = store.lead_keys(session)
        exported = [(run_id, leads[run_id]) for run_id in latest if run_id in leads]
        self._render_new(session, exported)
        kept = {lead for _, lead in exported}
        self._runs = {lead: run for lead, run in self._runs.items() if lead in kept}
        # Two runs whose labels read the same: the newer one's series, as the builder does.
        newest: dict[object, _RunLines] = {}
        for _, lead in exported:
            run = self._runs[lead]
            newest.pop(run.labels, None)
            newest[run.labels] = run
        parts = []
        for family, header in self._headers.items():
            parts.append(header)
            parts.extend(run.families.get(family, "") for run in newest.values())
        return "".join(parts).encode()

    def _render_new(self, session: Session, exported: list[tuple[str, tuple[str, str]]]) -> None:
        """Render the lines of every exported run whose lead report has none yet."""
        new = [(run_id, lead) for run_id, lead in exported if lead not in self._runs]
        stored = store.lead_metric_rows(session, [run_id for run_id, _ in new])
        for run_id, lead in new:
            if run_id not in stored:
                continue  # deleted since the first query
            text = stored[run_id]
            if text is None:
                run_rows = metric_rows(self._parse(store.lead_report(session, run_id)))
            else:
                run_rows = [(f, n, labels, v) for f, n, labels, v in json.loads(text)]
            families: dict[str, str] = {}
            for family, line in _render(run_rows):
                families[family] = families.get(family, "") + line
            self._runs[lead] = _RunLines(_series_set(run_rows) or lead, families)

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

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from memest.builds.runs import fingerprint
from memest.schema import RunReport
from memest.service import store
from memest.service.metrics import _StoredReports
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


class MetricsCache:
    """The stored reports' exposition, rebuilt when the stored state changes."""

    def __init__(
        self, factory: sessionmaker[Session], parse: Callable[[Report], RunReport]
    ) -> None:
        self._factory = factory
        self._parse = parse
        self._lock = threading.Lock()
        self._state: tuple[int, int, str] | None = None
        self._text = b""

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
        # Every run, oldest first: the newest sample per label set wins, and the labels name the
        # configuration and who sized its KV cache, so an enable and an apply start of one
        # configuration stay two series (memest.service.metrics.STORED_LABELS).
        runs = [run[0] for run in store.runs_oldest_first(session, self._parse)]
        stored = store.lead_metric_rows(session, runs)
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
        for run_id in runs:
            if run_id not in stored:
                continue  # deleted since the first query
            rows = stored[run_id]
            if rows is None:
                run_rows = metric_rows(self._parse(store.lead_report(session, run_id)))
            else:
                run_rows = [(f, n, labels, v) for f, n, labels, v in json.loads(rows)]
            for family, name, labels, value in run_rows:
                # Two runs whose labels read the same: the newer one's sample, as the builder does.
                key = (name, tuple(sorted(labels.items())))
                samples.pop(key, None)
                samples[key] = (family, name, labels, value)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(list(samples.values())))
        return generate_latest(registry)

"""Prometheus series: graph-pool bytes per model/build/configuration/stage/owner, estimator error,
KV tokens, and ingest counters. One registry per app, so several apps (tests) never share series.

The stored series are labelled ``model``, ``build`` and ``config`` (the configuration
fingerprint the history page shows): one set per configuration actually started with a build,
so their number is bounded by the stored runs' distinct (model, build, configuration), never
by the runs themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from memest.analysis.stages import stage_bars
from memest.estimate import account
from memest.identity import with_default_label
from memest.schema import RunReport

#: Owners per capture stage in memest_graph_pool_bytes: the largest, the rest summed as "other"
#: (memest.analysis.stages.OTHER_OWNER), so a report with thousands of owners adds few series.
OWNERS_PER_STAGE = 8
#: Stages per run in memest_graph_pool_bytes: those of most growth, the rest summed as stage
#: "other" (memest.analysis.stages.OTHER_STAGE); real reports have at most 10.
STAGES_PER_RUN = 16


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["model", "build", "config", *labels])


class _StoredReports(Collector):
    """Gauges computed at scrape time from the newest run of every (model, build, configuration).

    ``latest`` gives each such run's lead report with its configuration fingerprint, oldest
    first. Every figure comes from the run's accounting (memest.estimate.account), one series
    each: should two entries carry the same labels, the newer one is exported.
    """

    def __init__(self, latest: Callable[[], list[tuple[RunReport, str]]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pool = _gauge(
            "memest_graph_pool_bytes",
            "Graph-pool growth of the newest run per model, build and configuration, by capture "
            "stage and owner",
            "stage",
            "owner",
        )
        pool_total = _gauge(
            "memest_graph_pool_total_bytes",
            "Graph-pool growth over capture of the newest run per model, build and configuration",
        )
        kv = _gauge("memest_kv_tokens", "KV-cache capacity in tokens")
        kv_bytes = _gauge("memest_kv_cache_bytes", "KV cache the start allocated, bytes")
        non_kv = _gauge("memest_non_kv_bytes", "Usage minus the KV cache: every other byte kept")
        err = _gauge(
            "memest_estimator_error_bytes",
            "Usage minus budget (positive = over budget), per estimator; 'measured' is the start "
            "itself",
            "estimator",
        )
        newest: dict[tuple[str, str, str], RunReport] = {}
        for rep, fp in self._latest():
            key = (rep.model, with_default_label(rep.build).label, fp)
            newest.pop(key, None)
            newest[key] = rep
        for (model, build, fp), rep in newest.items():
            labels = [model, build, fp]
            for bar in stage_bars(rep, max_owners=OWNERS_PER_STAGE, max_stages=STAGES_PER_RUN):
                for seg in bar.owners:
                    pool.add_metric([*labels, bar.stage, seg.owner], seg.bytes)
            acc = account(rep)
            for family, value in (
                (pool_total, acc.graph_pool_bytes),
                (kv, acc.kv_tokens),
                (kv_bytes, acc.kv_cache_bytes),
                (non_kv, acc.non_kv_bytes),
            ):
                if value is not None:
                    family.add_metric(labels, value)
            for rec in acc.estimators:
                if rec.usage_minus_budget_bytes is not None:
                    err.add_metric([*labels, rec.estimator], rec.usage_minus_budget_bytes)
        yield from (pool, pool_total, kv, kv_bytes, non_kv, err)


class ServiceMetrics:
    """The app's registry, and its ingest counters."""

    def __init__(self, latest: Callable[[], list[tuple[RunReport, str]]] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.ingested = Counter(
            "memest_ingest_reports",
            "Reports received by POST /api/v1/reports, by outcome",
            labelnames=["outcome"],
            registry=self.registry,
        )
        self.ingest_bytes = Counter(
            "memest_ingest_bytes", "Bytes of accepted report bodies", registry=self.registry
        )
        for outcome in ("created", "exists", "rejected", "unauthorized"):
            self.ingested.labels(outcome=outcome)
        if latest is not None:  # else served by memest.service.metrics_cache
            self.registry.register(_StoredReports(latest))

"""Prometheus series: graph-pool bytes per model/build/stage/owner, estimator error, KV tokens,
and ingest counters. One registry per app, so several apps (tests) never share series."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from memest.reporters.views import run_facts, stage_bars
from memest.schema import RunReport


class _StoredReports(Collector):
    """Gauges computed at scrape time from the newest run of every (model, build)."""

    def __init__(self, latest: Callable[[], list[RunReport]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pool = GaugeMetricFamily(
            "memest_graph_pool_bytes",
            "Graph-pool growth of the newest run per model and build, by capture stage and owner",
            labels=["model", "build", "stage", "owner"],
        )
        pool_total = GaugeMetricFamily(
            "memest_graph_pool_total_bytes",
            "Graph-pool growth over capture of the newest run per model and build",
            labels=["model", "build"],
        )
        kv = GaugeMetricFamily(
            "memest_kv_tokens", "KV-cache capacity in tokens", labels=["model", "build"]
        )
        err = GaugeMetricFamily(
            "memest_estimator_error_bytes",
            "Usage minus budget at the end of init (positive = over budget), per estimator",
            labels=["model", "build", "estimator"],
        )
        for rep in self._latest():
            build = rep.build.label
            for bar in stage_bars(rep):
                for seg in bar.owners:
                    pool.add_metric([rep.model, build, bar.stage, seg.owner], seg.bytes)
            facts = run_facts(rep)
            if facts.graph_pool_bytes is not None:
                pool_total.add_metric([rep.model, build], facts.graph_pool_bytes)
            if facts.kv_tokens is not None:
                kv.add_metric([rep.model, build], facts.kv_tokens)
            for rec in rep.estimate.records if rep.estimate else []:
                if rec.usage_minus_budget_bytes is not None:
                    err.add_metric([rep.model, build, rec.estimator], rec.usage_minus_budget_bytes)
        yield pool
        yield pool_total
        yield kv
        yield err


class ServiceMetrics:
    """The app's registry, and its ingest counters."""

    def __init__(self, latest: Callable[[], list[RunReport]]) -> None:
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
        self.registry.register(_StoredReports(latest))

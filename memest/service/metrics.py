"""Prometheus series: one family per figure of a start's accounting (budget, usage, usage minus
budget per estimator, KV bytes and tokens, non-KV, graph pool in total and per stage and owner,
vLLM 0.34's growable KV cache and the margin memest expects unused),
and ingest counters. One registry per app, so several apps (tests) never share series.

The builder (_StoredReports) yields each start's samples labelled with STORED_LABELS: ``model``,
``build``, ``config`` (the configuration fingerprint the history page shows), ``mode`` (measure /
apply / plan) and ``sized_by`` (who sized the KV cache). Those five name a series set: one per
configuration and mode actually started with a build, so their number is bounded by the stored
runs' distinct sets, never by the runs themselves. The exposition (memest.service.metrics_cache)
writes them once per set, on memest_run_info, and labels each value series with ``model`` and
``key`` (series_key) only, so a fleet's text stays small; PromQL joins the rest back with
``* on(model, key) group_left(...) memest_run_info``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from memest.analysis.stages import stage_bars
from memest.estimate import account
from memest.identity import with_default_label
from memest.reporters.growable import growable_rows
from memest.reporters.owners import owner_label
from memest.reporters.regression import sized_by, start_mode
from memest.schema import RunReport

#: Owners per capture stage in memest_graph_pool_bytes: the largest, the rest summed as "other"
#: (memest.analysis.stages.OTHER_OWNER), so a report with thousands of owners adds few series.
OWNERS_PER_STAGE = 8
#: Stages per run in memest_graph_pool_bytes: those of most growth, the rest summed as stage
#: "other" (memest.analysis.stages.OTHER_STAGE); real reports have at most 10.
STAGES_PER_RUN = 16

#: Labels of every stored series: the configuration's identity, then who sized the KV cache
#: (memest.reporters.regression): an enable and an apply start of one configuration are two
#: series, never one that jumps between them.
STORED_LABELS = ("model", "build", "config", "mode", "sized_by")

#: The exposition's label naming a series set within its model (series_key), beside ``model``.
KEY_LABEL = "key"
#: One series per set, every figure of a set, written once: value 1 with STORED_LABELS and KEY_LABEL.
RUN_INFO = "memest_run_info"
#: One series per owner of the exported graph-pool series: owner_id and the owner in words.
OWNER_INFO = "memest_owner_info"
#: The families of every scrape (a fleet's): one series per set each, so a set costs its info line
#: and four short value lines. The others (per estimator, per stage and owner, graph pool total,
#: non-KV) come with ``GET /metrics?detail=true`` only.
FLEET_FAMILIES = (
    "memest_kv_tokens",
    "memest_kv_cache_bytes",
    "memest_budget_bytes",
    "memest_usage_bytes",
)


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=[*STORED_LABELS, *labels])


def _families() -> dict[str, GaugeMetricFamily]:
    """One family per quantity of the accounting, by its StartAccounting field (or role)."""
    return {
        "pool": _gauge(
            "memest_graph_pool_bytes",
            "Graph-pool growth of the newest run per model, build, configuration and mode, by "
            "capture stage and owner (owner_id: memest's name; memest_owner_info says it in "
            "words)",
            "stage",
            "owner",
            "owner_id",
        ),
        "graph_pool_bytes": _gauge(
            "memest_graph_pool_total_bytes",
            "Graph-pool growth over capture of the newest run per model, build, configuration "
            "and mode",
        ),
        "budget_bytes": _gauge(
            "memest_budget_bytes", "vLLM's requested memory: gpu_memory_utilization x total"
        ),
        "usage_bytes": _gauge(
            "memest_usage_bytes",
            "Device memory in use at the end of init plus serving's first full-size step",
        ),
        "kv_tokens": _gauge("memest_kv_tokens", "KV-cache capacity in tokens"),
        "kv_cache_bytes": _gauge("memest_kv_cache_bytes", "KV cache the start allocated, bytes"),
        "non_kv_bytes": _gauge(
            "memest_non_kv_bytes", "Usage minus the KV cache: every other byte kept"
        ),
        "kv_group_share": _gauge(
            "memest_kv_group_share",
            "Hybrid models: the share of the KV budget a request at max_model_len takes in each "
            "KV-cache group (group: its index in vLLM's groups, kind: full_attention, "
            "sliding_window, mla, mamba)",
            "group",
            "kind",
        ),
        "kv_group_tokens": _gauge(
            "memest_kv_group_tokens",
            "Hybrid models: tokens each attention KV-cache group holds at max concurrency",
            "group",
            "kind",
        ),
        "growable": _gauge(
            "memest_growable_kv_bytes",
            "vLLM 0.34's growable KV cache beside memest's terms (figure: committed_kv_bytes, "
            "vllm_transient_bytes, vllm_margin_bytes, memest_need_bytes, "
            "memest_need_beyond_vllm_bytes, margin_unused_bytes: the GiB of vLLM's margin memest "
            "expects unused, negative where it falls short)",
            "figure",
        ),
        "error": _gauge(
            "memest_estimator_error_bytes",
            "Usage minus budget (positive = over budget), per estimator; 'measured' is the start "
            "itself",
            "estimator",
        ),
    }


#: The accounting's start-wide figures, each a family of the same name in _families().
FIGURES = (
    "graph_pool_bytes",
    "budget_bytes",
    "usage_bytes",
    "kv_tokens",
    "kv_cache_bytes",
    "non_kv_bytes",
)


def _add_start(families: dict[str, GaugeMetricFamily], labels: list[str], rep: RunReport) -> None:
    """Every series of one start, read from its accounting (and its stage bars)."""
    for bar in stage_bars(rep, max_owners=OWNERS_PER_STAGE, max_stages=STAGES_PER_RUN):
        for seg in bar.owners:
            families["pool"].add_metric(
                [*labels, bar.stage, owner_label(seg.owner), seg.owner], seg.bytes
            )
    acc = account(rep)
    for field in FIGURES:
        value = getattr(acc, field)
        if value is not None:
            families[field].add_metric(labels, value)
    for i, g in enumerate(acc.kv_groups):
        families["kv_group_share"].add_metric([*labels, str(i), g.kind], g.share)
        if g.tokens is not None:
            families["kv_group_tokens"].add_metric([*labels, str(i), g.kind], g.tokens)
    if acc.growable_kv is not None:
        for key, _, value in growable_rows(acc.growable_kv):
            if value is not None:
                families["growable"].add_metric([*labels, key], value)
    for rec in acc.estimators:
        if rec.usage_minus_budget_bytes is not None:
            families["error"].add_metric([*labels, rec.estimator], rec.usage_minus_budget_bytes)


def series_key(labels: tuple[str, ...]) -> str:
    """KEY_LABEL's value for a set's STORED_LABELS values: a digest of all but the model, 8 hex
    digits (two sets of one model share one with odds of about 1 in 4 billion)."""
    text = "\0".join(labels[1:]).encode()
    return hashlib.blake2b(text, digest_size=4).hexdigest()


def start_labels(rep: RunReport, fingerprint: str) -> list[str]:
    """The values of STORED_LABELS for one start."""
    acc = account(rep)
    return [
        rep.model,
        with_default_label(rep.build).label,
        fingerprint,
        start_mode(acc),
        sized_by(acc),
    ]


class _StoredReports(Collector):
    """Gauges computed at scrape time from the newest run of every (model, build, configuration,
    who sized the KV cache).

    ``latest`` gives each such run's lead report with its configuration fingerprint, oldest
    first. Every figure comes from the run's accounting (memest.estimate.account), one series
    each: should two entries carry the same labels, the newer one is exported.
    """

    def __init__(self, latest: Callable[[], list[tuple[RunReport, str]]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = _families()
        newest: dict[tuple[str, ...], RunReport] = {}
        for rep, fp in self._latest():
            key = tuple(start_labels(rep, fp))
            newest.pop(key, None)
            newest[key] = rep
        for labels, rep in newest.items():
            _add_start(families, list(labels), rep)
        yield from families.values()


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

"""What one start is and the figures tracked per build: its facts (from the start's accounting),
the graph-count table of the capture plan it ran, and its identity (build, configuration).

Comparisons (memest.builds.compare) and histories (memest.builds.history) are built from
these; the reporters and the service format them. No I/O here.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from memest.analysis.ranks import capture_stages
from memest.estimate import account
from memest.identity import config_fingerprint, model_display_name, with_default_label
from memest.schema import CapturePlan, RunConfig, RunReport, StartAccounting


class RunnerCount(BaseModel):
    """A row of the capture plan's graph-count table."""

    runner: str
    label: str
    graph_mode: str | None = None
    graph_count: int | None = None
    widest: str | None = None
    source: str = Field(description="'plan:<sizing>' or 'breakdown' (counted at capture)")


class RunFacts(BaseModel):
    """The handful of numbers tracked per build, read from the start's accounting."""

    definition: str = Field(
        default="current", description="'current' (recomputed) or 'stored' (older definition)"
    )
    definition_note: str = ""
    kv_tokens: int | None = None
    kv_cache_bytes: int | None = None
    non_kv_bytes: int | None = None
    max_concurrency: float | None = None
    graph_pool_bytes: int | None = None
    total_added_bytes: int | None = None
    cudagraph_estimate_bytes: int | None = Field(
        default=None, description="vLLM's graph estimate (the vllm estimator record's figure)"
    )
    cudagraph_logged_bytes: int | None = Field(
        default=None,
        description="What vLLM logged as its graph estimate in this start, when that differs "
        "(apply and plan starts profile under memest's budget)",
    )
    usage_kind: str | None = None
    usage_minus_budget_bytes: int | None = Field(
        default=None, description="This start: usage minus budget (positive = over budget)"
    )
    estimator_error_bytes: int | None = Field(
        default=None, description="vLLM's budget: usage minus budget (positive = over budget)"
    )
    memest_error_bytes: int | None = Field(
        default=None, description="memest's budget: usage minus budget, when the run carries it"
    )
    total_graphs: int | None = None
    kv_sized_by: str | None = Field(
        default=None,
        description="Who sized this start's KV cache: 'vllm', 'memest' (apply mode) or "
        "'memest-plan' (a startup plan); None when the report does not say",
    )


def kv_sized_by(report: RunReport) -> str | None:
    """Who sized the start's KV cache (the start's accounting): 'vllm', 'memest' or
    'memest-plan'."""
    return account(report).kv_sized_by


def kv_tokens(report: RunReport) -> int | None:
    """KV capacity in tokens (the start's accounting)."""
    return account(report).kv_tokens


def graph_pool_bytes(report: RunReport) -> int | None:
    """Reserved growth of all graph pools over the real capture (the start's accounting)."""
    return account(report).graph_pool_bytes


def _error(accounting: StartAccounting, estimator: str) -> int | None:
    rec = accounting.estimator(estimator)
    return rec.usage_minus_budget_bytes if rec is not None else None


def estimator_error(report: RunReport, estimator: str) -> int | None:
    """Usage minus budget of one estimator's record, in bytes (None when absent)."""
    return _error(account(report), estimator)


def run_facts(report: RunReport) -> RunFacts:
    """Per-build numbers of one report."""
    acc = account(report)
    counts = [r.graph_count for r in runner_counts(report) if r.graph_count is not None]
    return RunFacts(
        definition=acc.definition,
        definition_note=acc.definition_note,
        kv_tokens=acc.kv_tokens,
        kv_cache_bytes=acc.kv_cache_bytes,
        non_kv_bytes=acc.non_kv_bytes,
        max_concurrency=acc.max_concurrency,
        graph_pool_bytes=acc.graph_pool_bytes,
        total_added_bytes=acc.capture_added_bytes,
        cudagraph_estimate_bytes=acc.vllm_cudagraph_estimate_bytes,
        cudagraph_logged_bytes=(
            acc.vllm_cudagraph_logged_bytes
            if acc.vllm_cudagraph_logged_bytes != acc.vllm_cudagraph_estimate_bytes
            else None
        ),
        usage_kind=acc.usage_kind,
        usage_minus_budget_bytes=acc.usage_minus_budget_bytes,
        estimator_error_bytes=_error(acc, "vllm"),
        memest_error_bytes=_error(acc, "memest"),
        total_graphs=sum(counts) if counts else None,
        kv_sized_by=acc.kv_sized_by,
    )


def ran_plan(report: RunReport) -> CapturePlan | None:
    """The capture plan the start ran: vLLM's own sizing (``vllm-<version>``) when the report
    carries it, else its first plan; None when it carries none."""
    plans = report.capture_plans
    own = [p for p in plans if p.sizing.startswith("vllm-")]
    return own[0] if own else plans[0] if plans else None


def runner_counts(report: RunReport) -> list[RunnerCount]:
    """The graph-count table: the capture plan the start ran (``ran_plan``), else the stages'
    counted graphs."""
    plan = ran_plan(report)
    if plan is not None:
        out = []
        for r in plan.runners:
            if r.widest_requests is not None and r.unit == "requests":
                widest = f"{r.widest_requests} requests x q={r.q}"
            else:
                widest = f"{r.widest_tokens} tokens"
            out.append(
                RunnerCount(
                    runner=r.runner,
                    label=r.label,
                    graph_mode=r.graph_mode,
                    graph_count=r.graph_count,
                    widest=widest,
                    source=f"plan:{plan.sizing}",
                )
            )
        return out
    if report.breakdown is None:
        return []
    return [
        RunnerCount(
            runner=s.stage,
            label=s.stage,
            graph_mode="FULL" if s.stage.endswith(".full") else "PIECEWISE",
            graph_count=s.graph_count,
            widest=s.widest,
            source="breakdown",
        )
        for s in capture_stages(report)
        if s.graph_count is not None
    ]


class RunRef(BaseModel):
    """One side of a comparison: which run, of which build, commit and configuration."""

    run_id: str
    model: str
    model_name: str = Field(default="", description="The model as users know it, never a path")
    build: str = Field(description="Build label; default vllm-<version>+memest-<version>")
    commit: str | None = None
    source: str
    created_at: datetime | None = None
    config_fingerprint: str = ""
    config_summary: str = Field(default="", description="The configuration in a few words")
    kv_sized_by: str | None = Field(
        default=None, description="Who sized the start's KV cache: vllm, memest or memest-plan"
    )


class Change(BaseModel):
    """One thing two runs differ in: the build, the commit or a configuration field."""

    field: str
    a: str
    b: str


def build_label(report: RunReport) -> str:
    """The report's build label, defaulted to vllm-<version>+memest-<version> when empty."""
    return with_default_label(report.build).label


def fingerprint(report: RunReport) -> str:
    """The report's configuration fingerprint (computed from its config when it carries none)."""
    return report.config_fingerprint or config_fingerprint(report.config)


def config_summary(config: RunConfig) -> str:
    """The configuration an operator sets, in a few words."""
    parts = []
    if config.max_num_seqs is not None:
        parts.append(f"{config.max_num_seqs} seqs")
    if config.max_num_batched_tokens is not None:
        parts.append(f"{config.max_num_batched_tokens} batched tokens")
    if config.max_model_len is not None:
        parts.append(f"max_model_len {config.max_model_len}")
    if config.gpu_memory_utilization is not None:
        parts.append(f"utilization {config.gpu_memory_utilization:g}")
    if config.tensor_parallel_size > 1:
        parts.append(f"TP {config.tensor_parallel_size}")
    if config.speculative_method:
        parts.append(f"{config.speculative_method} K={config.num_speculative_tokens}")
    else:
        parts.append("no drafter")
    if config.cudagraph_mode:
        parts.append(config.cudagraph_mode)
    return " · ".join(parts)


def _config_value(value: object) -> str:
    if isinstance(value, list) and len(value) > 6:
        return f"{len(value)} sizes, widest {max(value)}" if value else "[]"
    text = str(value) if not isinstance(value, dict) else str(dict(sorted(value.items())))
    return text if len(text) <= 80 else text[:79] + "…"


def config_values(config: RunConfig) -> dict[str, str]:
    """Every configuration field as a page shows it (long lists and mappings shortened)."""
    values = config.model_dump()
    return {name: _config_value(values[name]) for name in RunConfig.model_fields}


def config_changes(a: RunConfig, b: RunConfig) -> list[Change]:
    """The configuration fields that differ, A's value beside B's."""
    da, db = a.model_dump(), b.model_dump()
    return [
        Change(field=name, a=_config_value(da[name]), b=_config_value(db[name]))
        for name in RunConfig.model_fields
        if da[name] != db[name]
    ]


def run_ref(report: RunReport) -> RunRef:
    return RunRef(
        run_id=report.run_id,
        model=report.model,
        model_name=model_display_name(report.model),
        build=build_label(report),
        commit=report.build.vllm_commit,
        source=report.source,
        created_at=report.created_at,
        config_fingerprint=fingerprint(report),
        config_summary=config_summary(report.config),
        kv_sized_by=kv_sized_by(report),
    )

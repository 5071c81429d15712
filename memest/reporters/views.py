"""Pure views over RunReports: per-run stage/owner bars, build comparisons and model history.

The service, the HTML dashboard and ``memest report`` all render these, so the numbers on a page,
in the API and in a markdown report come from one computation. No I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from memest.analysis.ranks import capture_stages
from memest.analysis.stages import stage_bars
from memest.estimate import account
from memest.identity import (
    config_fingerprint,
    model_display_name,
    with_default_label,
)
from memest.reporters.owners import owner_key, owner_label
from memest.schema import CapturePlan, PhaseRecord, RunConfig, RunReport, StartAccounting
from memest.schema.breakdown import PhaseSplit
from memest.units import GiB, fmt_gib

#: A later build regresses when its KV tokens drop by more than this fraction ...
KV_DROP_FRACTION = 0.01
#: ... or its graph pool grows by more than this fraction ...
POOL_GROWTH_FRACTION = 0.05
#: ... or the magnitude of its estimator error grows by more than this many bytes.
ESTIMATE_ERROR_GROWTH_BYTES = GiB // 4


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


#: How a report says who sized its KV cache: the plugin's note, or its measured record's note.
_SIZED_BY = re.compile(r"KV (?:cache of this start )?sized by ([a-z-]+)")


def kv_sized_by(report: RunReport) -> str | None:
    """Who sized the start's KV cache, as the report says: 'vllm', 'memest' or 'memest-plan'."""
    records = [] if report.estimate is None else report.estimate.records
    for text in [*report.notes, *(r.note for r in records if r.estimator == "measured")]:
        m = _SIZED_BY.search(text)
        if m:
            return m.group(1)
    return None


def definition_line(report: RunReport, accounting: StartAccounting) -> str:
    """What a start's figures are when memest cannot recompute them (empty when it can):
    published figures say so, a measured start says it was measured by an older definition."""
    if accounting.definition != "stored":
        return ""
    note = accounting.definition_note
    reason = note.split(": ", 1)[1] if ": " in note else note
    if report.source == "published":
        return f"Published figures, not measured by memest: {short_paths(reason)}"
    return f"Measured by an older definition: {short_paths(reason)}"


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
        kv_sized_by=kv_sized_by(report),
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


class Delta(BaseModel):
    """One figure on build A and build B (the seed's "main → PR" cells)."""

    key: str
    label: str
    a: int | None = None
    b: int | None = None
    delta: int | None = None
    ratio: float | None = None
    a_text: str | None = Field(default=None, description="Non-numeric cell, e.g. widest shape")
    b_text: str | None = None


def _delta(key: str, label: str, a: int | None, b: int | None, **kw: str | None) -> Delta:
    return Delta(
        key=key,
        label=label,
        a=a,
        b=b,
        delta=None if a is None or b is None else b - a,
        ratio=None if a is None or a <= 0 or b is None or b < 0 else b / a,
        **kw,
    )


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


class Comparison(BaseModel):
    """Build A against build B: phases, stages, owners, runners and the KV outcome."""

    a: RunRef
    b: RunRef
    a_name: str = Field(default="A", description="Run A in column headers: its build, else 'A'")
    b_name: str = Field(default="B", description="Run B in column headers: its build, else 'B'")
    changes: list[Change] = Field(
        default_factory=list, description="What differs between A and B (build, commit, config)"
    )
    phases: list[Delta]
    stages: list[Delta]
    stage_graph_counts: list[Delta]
    owners: list[Delta]
    runners: list[Delta]
    estimate: list[Delta]
    kv_ratio: float | None = Field(description="KV tokens of B over A (the seed's 'KV vs main')")


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


def changes(a: RunReport, b: RunReport) -> list[Change]:
    """What two runs differ in: build label, vLLM and memest versions, commit, GPU, who sized the
    KV cache (vLLM, or memest in apply/plan mode: MEMEST_ESTIMATE), configuration."""
    out = []
    pairs = (
        ("build", build_label(a), build_label(b)),
        ("vllm_version", a.build.vllm_version, b.build.vllm_version),
        ("memest_version", a.build.memest_version, b.build.memest_version),
        ("commit", a.build.vllm_commit, b.build.vllm_commit),
        ("gpu", a.gpu.name if a.gpu else None, b.gpu.name if b.gpu else None),
        ("kv_sized_by", kv_sized_by(a), kv_sized_by(b)),
    )
    for name, x, y in pairs:
        if x != y:
            out.append(Change(field=name, a=str(x or "–"), b=str(y or "–")))
    return out + config_changes(a.config, b.config)


def _phase_map(report: RunReport) -> dict[str, int]:
    out: dict[str, int] = {}
    if report.breakdown is None:
        return out
    for ph in report.breakdown.phases:
        if ph.phase == "capture":
            out = {
                "total": ph.total_added_bytes,
                "graph_pool": ph.graph_pool_bytes,
                "other_torch": ph.other_torch_bytes,
                "outside_torch": ph.outside_torch_bytes,
            }
    return out


_PHASE_LABELS = {
    "total": "Total",
    "graph_pool": "CUDA graph pools",
    "other_torch": "Other PyTorch buffers and cached memory",
    "outside_torch": "CUDA / library allocations outside PyTorch",
}


def _stage_deltas(a: RunReport, b: RunReport) -> tuple[list[Delta], list[Delta], list[str]]:
    """Pool growth and graph count per stage (with totals), and the stage order."""
    sa = {s.stage: s for s in capture_stages(a)}
    sb = {s.stage: s for s in capture_stages(b)}
    order = list(sa) + [s for s in sb if s not in sa]
    stages = []
    counts = []
    for name in order:
        x, y = sa.get(name), sb.get(name)
        stages.append(
            _delta(
                name,
                name,
                x.pool_growth_bytes if x else None,
                y.pool_growth_bytes if y else None,
                a_text=x.widest if x else None,
                b_text=y.widest if y else None,
            )
        )
        counts.append(
            _delta(name, name, x.graph_count if x else None, y.graph_count if y else None)
        )
    stages.append(_delta("total", "Total graph pool", graph_pool_bytes(a), graph_pool_bytes(b)))
    ca = [c.a for c in counts if c.a is not None]
    cb = [c.b for c in counts if c.b is not None]
    counts.append(_delta("total", "Total graphs", sum(ca) if ca else None, sum(cb) if cb else None))
    return stages, counts, order


def _owner_deltas(a: RunReport, b: RunReport, order: list[str]) -> list[Delta]:
    """Pool bytes per stage and owner, owners matched by what they are (owner_key).

    A stage's trigger rows charge all of its growth, so an owner a run's stage does not list
    took 0 bytes of it; only a stage the run did not capture is missing (None).
    """
    oa, ob = _owner_map(a), _owner_map(b)
    stages_a = {s.stage for s in capture_stages(a)}
    stages_b = {s.stage for s in capture_stages(b)}
    rank = {name: i for i, name in enumerate(order)}
    keys = sorted(
        list(oa) + [k for k in ob if k not in oa],
        key=lambda k: (rank.get(k[0], len(rank)), -max(oa.get(k, 0), ob.get(k, 0))),
    )
    out = []
    for stage, key in keys:
        va = oa.get((stage, key), 0 if stage in stages_a else None)
        vb = ob.get((stage, key), 0 if stage in stages_b else None)
        out.append(_delta(f"{stage}/{key}", f"{stage} · {owner_label(key)}", va, vb))
    return out


def _runner_deltas(a: RunReport, b: RunReport) -> list[Delta]:
    ra = {r.runner: r for r in runner_counts(a)}
    rb = {r.runner: r for r in runner_counts(b)}
    out = []
    for name in list(ra) + [n for n in rb if n not in ra]:
        x, y = ra.get(name), rb.get(name)
        label = x.label if x else y.label if y else name
        out.append(
            _delta(
                name,
                label,
                x.graph_count if x else None,
                y.graph_count if y else None,
                a_text=x.widest if x else None,
                b_text=y.widest if y else None,
            )
        )
    return out


def _estimate_deltas(fa: RunFacts, fb: RunFacts) -> list[Delta]:
    out = [
        _delta(
            "cudagraph_estimate",
            "vLLM's CUDA-graph estimate",
            fa.cudagraph_estimate_bytes,
            fb.cudagraph_estimate_bytes,
        ),
        _delta("kv_cache_bytes", "KV cache", fa.kv_cache_bytes, fb.kv_cache_bytes),
        _delta("kv_tokens", "Measured KV capacity, tokens", fa.kv_tokens, fb.kv_tokens),
        _delta(
            "usage_minus_budget_start",
            "Usage minus budget (this start)",
            fa.usage_minus_budget_bytes,
            fb.usage_minus_budget_bytes,
        ),
        _delta(
            "usage_minus_budget",
            "Usage minus budget (vLLM estimate)",
            fa.estimator_error_bytes,
            fb.estimator_error_bytes,
        ),
    ]
    if fa.memest_error_bytes is not None or fb.memest_error_bytes is not None:
        out.append(
            _delta(
                "usage_minus_budget_memest",
                "Usage minus budget (memest estimate)",
                fa.memest_error_bytes,
                fb.memest_error_bytes,
            )
        )
    return out


def compare(a: RunReport, b: RunReport) -> Comparison:
    """Compare build ``a`` (e.g. main) with build ``b`` (e.g. the change)."""
    pa, pb = _phase_map(a), _phase_map(b)
    phases = [
        _delta(k, v, pa.get(k), pb.get(k)) for k, v in _PHASE_LABELS.items() if k in pa or k in pb
    ]
    stages, counts, order = _stage_deltas(a, b)
    fa, fb = run_facts(a), run_facts(b)
    kv_ratio = None
    if fa.kv_tokens and fb.kv_tokens is not None:
        kv_ratio = fb.kv_tokens / fa.kv_tokens
    ref_a, ref_b = run_ref(a), run_ref(b)
    distinct = ref_a.build != ref_b.build
    return Comparison(
        a=ref_a,
        b=ref_b,
        a_name=ref_a.build if distinct and ref_a.build else "A",
        b_name=ref_b.build if distinct and ref_b.build else "B",
        changes=changes(a, b),
        phases=phases,
        stages=stages,
        stage_graph_counts=counts,
        owners=_owner_deltas(a, b, order),
        runners=_runner_deltas(a, b),
        estimate=_estimate_deltas(fa, fb),
        kv_ratio=kv_ratio,
    )


def _owner_map(report: RunReport) -> dict[tuple[str, str], int]:
    """Pool bytes per (stage, owner_key): owners that are one thing under two names add up."""
    out: dict[tuple[str, str], int] = {}
    for bar in stage_bars(report):
        for seg in bar.owners:
            key = (bar.stage, owner_key(seg.owner))
            out[key] = out.get(key, 0) + seg.bytes
    return out


class HistoryPoint(BaseModel):
    """One build of a model, in time order, with the regressions it introduced."""

    run_id: str
    build: str
    commit: str | None = None
    created_at: datetime
    source: str
    config_fingerprint: str = ""
    config_summary: str = ""
    series: int = Field(
        default=0, description="Index of the point's configuration in History.configs"
    )
    kv_tokens: int | None = None
    graph_pool_bytes: int | None = None
    estimator_error_bytes: int | None = None
    kv_sized_by: str | None = Field(
        default=None,
        description="Who sized the start's KV cache: 'vllm', 'memest' (apply mode, "
        "MEMEST_ESTIMATE) or 'memest-plan'; None when the report does not say",
    )
    compared_with: str | None = Field(
        default=None,
        description="The previous run of the same configuration fingerprint whose KV cache the "
        "same estimator sized: the baseline of the regression checks (None: the first such run)",
    )
    config_changes: list[Change] = Field(
        default_factory=list,
        description="For the first run of a configuration: how it differs from the run before "
        "it (empty for a run with a baseline: that one has the same configuration)",
    )
    regressions: list[str] = Field(
        default_factory=list,
        description="kv_tokens, graph_pool_bytes or estimator_error_bytes when worse than the "
        "baseline (compared_with) by more than the thresholds",
    )


class HistoryConfig(BaseModel):
    """One configuration (fingerprint) among a model's runs: one series of the history."""

    fingerprint: str
    summary: str
    runs: int


#: How each regression key reads on a page.
REGRESSION_LABELS = {
    "kv_tokens": "KV tokens dropped",
    "graph_pool_bytes": "graph pool grew",
    "estimator_error_bytes": "vLLM's usage − budget grew",
}


class History(BaseModel):
    model: str
    points: list[HistoryPoint]
    configs: list[HistoryConfig] = Field(default_factory=list)
    regression_labels: dict[str, str] = Field(
        default_factory=lambda: dict(REGRESSION_LABELS),
        description="How each regression key reads",
    )
    kv_drop_fraction: float = KV_DROP_FRACTION
    pool_growth_fraction: float = POOL_GROWTH_FRACTION
    estimate_error_growth_bytes: int = ESTIMATE_ERROR_GROWTH_BYTES


def _regressions(p: HistoryPoint, prev: HistoryPoint) -> list[str]:
    """What got worse from ``prev`` (same configuration) to ``p`` beyond the thresholds."""
    out = []
    if p.kv_tokens is not None and prev.kv_tokens:
        if p.kv_tokens < prev.kv_tokens * (1 - KV_DROP_FRACTION):
            out.append("kv_tokens")
    if p.graph_pool_bytes is not None and prev.graph_pool_bytes:
        if p.graph_pool_bytes > prev.graph_pool_bytes * (1 + POOL_GROWTH_FRACTION):
            out.append("graph_pool_bytes")
    if p.estimator_error_bytes is not None and prev.estimator_error_bytes is not None:
        grow = abs(p.estimator_error_bytes) - abs(prev.estimator_error_bytes)
        if grow > ESTIMATE_ERROR_GROWTH_BYTES:
            out.append("estimator_error_bytes")
    return out


def history(model: str, reports: Sequence[RunReport]) -> History:
    """Per-build history of a model (one rank-0 report per run, oldest first).

    Regressions are checked against the previous run of the same configuration fingerprint
    whose KV cache the same estimator sized (an apply start's vLLM figure is a recomputation,
    not what vLLM gave); the first run of a configuration says how it differs from the run
    before it.
    """
    points: list[HistoryPoint] = []
    configs: dict[str, HistoryConfig] = {}
    last: dict[tuple[str, str | None], HistoryPoint] = {}
    prev_report: RunReport | None = None
    for rep in sorted(reports, key=lambda r: (r.created_at, r.run_id)):
        f = run_facts(rep)
        fp = fingerprint(rep)
        cfg = configs.setdefault(
            fp, HistoryConfig(fingerprint=fp, summary=config_summary(rep.config), runs=0)
        )
        cfg.runs += 1
        before = last.get((fp, f.kv_sized_by))
        p = HistoryPoint(
            run_id=rep.run_id,
            build=build_label(rep),
            commit=rep.build.vllm_commit,
            created_at=rep.created_at,
            source=rep.source,
            config_fingerprint=fp,
            config_summary=cfg.summary,
            series=list(configs).index(fp),
            kv_tokens=f.kv_tokens,
            graph_pool_bytes=f.graph_pool_bytes,
            estimator_error_bytes=f.estimator_error_bytes,
            kv_sized_by=f.kv_sized_by,
            compared_with=before.run_id if before else None,
        )
        if before is not None:
            p.regressions = _regressions(p, before)
        elif prev_report is not None and fingerprint(prev_report) != fp:
            p.config_changes = config_changes(prev_report.config, rep.config)
        points.append(p)
        last[(fp, f.kv_sized_by)] = p
        prev_report = rep
    return History(model=model, points=points, configs=list(configs.values()))


def model_name(model: str) -> str:
    """The model as users know it (a local folder shows as its name): identity's one rule."""
    return model_display_name(model)


class PhaseRow(BaseModel):
    """A phase's added memory, with the phase it runs inside (its bytes are in that one too)."""

    split: PhaseSplit
    depth: int = 0
    parent: str | None = None


def phase_rows(splits: Sequence[PhaseSplit], records: Sequence[PhaseRecord]) -> list[PhaseRow]:
    """The phase split as a tree, from the phase windows: outer phases first, then the phases
    that run inside them (kv_cache_alloc inside initialize_from_config, ...). Only rows at depth
    0 add up; a phase without a window is a top-level row at the end."""
    windows = {r.name: (r.start.time_ns, r.end.time_ns) for r in records}
    timed = sorted(
        (s for s in splits if s.phase in windows),
        key=lambda s: (windows[s.phase][0], -windows[s.phase][1]),
    )
    rows: list[PhaseRow] = []
    stack: list[str] = []
    for split in timed:
        start, end = windows[split.phase]
        while stack and not (windows[stack[-1]][0] <= start and end <= windows[stack[-1]][1]):
            stack.pop()
        rows.append(PhaseRow(split=split, depth=len(stack), parent=stack[-1] if stack else None))
        stack.append(split.phase)
    rows += [PhaseRow(split=s) for s in splits if s.phase not in windows]
    return rows


#: How nested phase rows read; every surface that nests phases says this.
NESTED_NOTE = (
    "↳ A phase whose window lies inside the window of the phase it names: that phase's row is "
    "the net change over its whole window, so it already holds what the inner phase kept, and "
    "memest nets out what the inner phase added and the outer one freed before it ended (the "
    "graph-memory profiling throws away its KV cache and graphs), which is why an inner row can "
    "be larger than its outer one; only the unindented rows add up"
)

#: Why a phase's category can be negative; every surface that shows one says this.
NEGATIVE_NOTE = (
    "Negative: the phase gave memory back. PyTorch's cache shrank (empty_cache() returned "
    "cached blocks to the device) or memory outside PyTorch was freed; the phase's total "
    "already nets it out"
)


class Notes(BaseModel):
    """A report's notes for a page: the few that matter, and the diagnostics behind them."""

    shown: list[str]
    more: list[str]
    main: list[str] = Field(default_factory=list, description="Every note but the diagnostics")
    diagnostics: list[str] = Field(
        default_factory=list, description="The plugin's diagnostics (history stage rows, files)"
    )


#: Notes that are diagnostics of the plugin (per-stage history rows, where files were kept).
_DIAGNOSTIC = ("history stage row:", "allocator history kept at", "allocator history off")
#: An absolute path: shown as its file name only (no host folders on a page).
_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/:;,()]+/)+([^\s/:;,()]+)")
#: A byte figure in a plugin note ("570428928 B", "132096694682 -> 131000000000 B").
_BYTES = re.compile(r"(?<![\w.])(-?\d+)(?: -> (-?\d+))? B\b")
#: The plugin's name for what vLLM logged as its graph estimate, and every surface's name for it.
_LOGGED = ("graph memory: vLLM estimate ", "graph memory: vLLM's logged graph estimate ")


def short_paths(text: str) -> str:
    """``text`` with each absolute path cut to its file name."""
    return _PATH.sub(lambda m: m.group(1), text)


def _gib_figure(m: re.Match[str]) -> str:
    first = fmt_gib(int(m.group(1)))
    return f"{first} GiB" if m.group(2) is None else f"{first} -> {fmt_gib(int(m.group(2)))} GiB"


def readable_note(text: str) -> str:
    """A plugin note as surfaces show it: paths cut to file names, byte figures in GiB
    (``memest.units.fmt_gib``), vLLM's logged graph estimate named as the accounting names it."""
    return _BYTES.sub(_gib_figure, short_paths(text)).replace(*_LOGGED)


def notes(report: RunReport, keep: int = 4) -> Notes:
    """Up to ``keep`` notes worth reading first; the plugin's diagnostics and the rest after."""
    lines = [readable_note(n) for n in report.notes]
    main = [n for n in lines if not n.startswith(_DIAGNOSTIC)]
    rest = [n for n in lines if n.startswith(_DIAGNOSTIC)]
    return Notes(shown=main[:keep], more=main[keep:] + rest, main=main, diagnostics=rest)

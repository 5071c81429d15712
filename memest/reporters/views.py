"""Pure views over RunReports: per-run stage/owner bars, build comparisons and model history.

The service, the HTML dashboard and ``memest report`` all render these, so the numbers on a page,
in the API and in a markdown report come from one computation. No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from memest.analysis.ranks import capture_stages
from memest.analysis.stages import stage_bars
from memest.estimate import account
from memest.schema import RunReport, StartAccounting
from memest.units import GiB

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
    cudagraph_estimate_bytes: int | None = None
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
        usage_kind=acc.usage_kind,
        usage_minus_budget_bytes=acc.usage_minus_budget_bytes,
        estimator_error_bytes=_error(acc, "vllm"),
        memest_error_bytes=_error(acc, "memest"),
        total_graphs=sum(counts) if counts else None,
    )


def runner_counts(report: RunReport) -> list[RunnerCount]:
    """The graph-count table: the report's first capture plan, else the stages' counted graphs."""
    if report.capture_plans:
        plan = report.capture_plans[0]
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
        ratio=None if not a or b is None else b / a,
        **kw,
    )


class RunRef(BaseModel):
    run_id: str
    model: str
    build: str
    commit: str | None = None
    source: str


class Comparison(BaseModel):
    """Build A against build B: phases, stages, owners, runners and the KV outcome."""

    a: RunRef
    b: RunRef
    phases: list[Delta]
    stages: list[Delta]
    stage_graph_counts: list[Delta]
    owners: list[Delta]
    runners: list[Delta]
    estimate: list[Delta]
    kv_ratio: float | None = Field(description="KV tokens of B over A (the seed's 'KV vs main')")


def run_ref(report: RunReport) -> RunRef:
    return RunRef(
        run_id=report.run_id,
        model=report.model,
        build=report.build.label,
        commit=report.build.vllm_commit,
        source=report.source,
    )


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


def compare(a: RunReport, b: RunReport) -> Comparison:
    """Compare build ``a`` (e.g. main) with build ``b`` (e.g. the change)."""
    pa, pb = _phase_map(a), _phase_map(b)
    phases = [
        _delta(k, v, pa.get(k), pb.get(k)) for k, v in _PHASE_LABELS.items() if k in pa or k in pb
    ]

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
    ga, gb = graph_pool_bytes(a), graph_pool_bytes(b)
    stages.append(_delta("total", "Total graph pool", ga, gb))
    ca = [c.a for c in counts if c.a is not None]
    cb = [c.b for c in counts if c.b is not None]
    counts.append(_delta("total", "Total graphs", sum(ca) if ca else None, sum(cb) if cb else None))

    oa = _owner_map(a)
    ob = _owner_map(b)
    rank = {name: i for i, name in enumerate(order)}
    okeys = sorted(
        list(oa) + [k for k in ob if k not in oa],
        key=lambda k: (rank.get(k[0], len(rank)), -max(oa.get(k, 0), ob.get(k, 0))),
    )
    owners = [
        _delta(f"{st}/{ow}", f"{st} · {ow}", oa.get((st, ow)), ob.get((st, ow))) for st, ow in okeys
    ]

    ra = {r.runner: r for r in runner_counts(a)}
    rb = {r.runner: r for r in runner_counts(b)}
    runners = []
    for name in list(ra) + [n for n in rb if n not in ra]:
        x2, y2 = ra.get(name), rb.get(name)
        runners.append(
            _delta(
                name,
                (x2 or y2).label if (x2 or y2) else name,  # type: ignore[union-attr]
                x2.graph_count if x2 else None,
                y2.graph_count if y2 else None,
                a_text=x2.widest if x2 else None,
                b_text=y2.widest if y2 else None,
            )
        )

    fa, fb = run_facts(a), run_facts(b)
    estimate = [
        _delta(
            "cudagraph_estimate",
            "Estimated CUDA-graph memory",
            fa.cudagraph_estimate_bytes,
            fb.cudagraph_estimate_bytes,
        ),
        _delta("kv_tokens", "Measured KV capacity, tokens", fa.kv_tokens, fb.kv_tokens),
        _delta(
            "usage_minus_budget",
            "Usage minus budget (vLLM estimate)",
            fa.estimator_error_bytes,
            fb.estimator_error_bytes,
        ),
    ]
    if fa.memest_error_bytes is not None or fb.memest_error_bytes is not None:
        estimate.append(
            _delta(
                "usage_minus_budget_memest",
                "Usage minus budget (memest estimate)",
                fa.memest_error_bytes,
                fb.memest_error_bytes,
            )
        )
    kv_ratio = None
    if fa.kv_tokens and fb.kv_tokens is not None:
        kv_ratio = fb.kv_tokens / fa.kv_tokens
    return Comparison(
        a=run_ref(a),
        b=run_ref(b),
        phases=phases,
        stages=stages,
        stage_graph_counts=counts,
        owners=owners,
        runners=runners,
        estimate=estimate,
        kv_ratio=kv_ratio,
    )


def _owner_map(report: RunReport) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for bar in stage_bars(report):
        for seg in bar.owners:
            out[(bar.stage, seg.owner)] = out.get((bar.stage, seg.owner), 0) + seg.bytes
    return out


class HistoryPoint(BaseModel):
    """One build of a model, in time order, with the regressions it introduced."""

    run_id: str
    build: str
    commit: str | None = None
    created_at: datetime
    source: str
    kv_tokens: int | None = None
    graph_pool_bytes: int | None = None
    estimator_error_bytes: int | None = None
    regressions: list[str] = Field(
        default_factory=list,
        description="kv_tokens, graph_pool_bytes or estimator_error_bytes when worse than the "
        "previous build by more than the thresholds",
    )


class History(BaseModel):
    model: str
    points: list[HistoryPoint]
    kv_drop_fraction: float = KV_DROP_FRACTION
    pool_growth_fraction: float = POOL_GROWTH_FRACTION
    estimate_error_growth_bytes: int = ESTIMATE_ERROR_GROWTH_BYTES


def history(model: str, reports: Sequence[RunReport]) -> History:
    """Per-build history of a model (one rank-0 report per run, oldest first)."""
    points: list[HistoryPoint] = []
    prev: HistoryPoint | None = None
    for rep in sorted(reports, key=lambda r: (r.created_at, r.run_id)):
        f = run_facts(rep)
        p = HistoryPoint(
            run_id=rep.run_id,
            build=rep.build.label,
            commit=rep.build.vllm_commit,
            created_at=rep.created_at,
            source=rep.source,
            kv_tokens=f.kv_tokens,
            graph_pool_bytes=f.graph_pool_bytes,
            estimator_error_bytes=f.estimator_error_bytes,
        )
        if prev is not None:
            if p.kv_tokens is not None and prev.kv_tokens:
                if p.kv_tokens < prev.kv_tokens * (1 - KV_DROP_FRACTION):
                    p.regressions.append("kv_tokens")
            if p.graph_pool_bytes is not None and prev.graph_pool_bytes:
                if p.graph_pool_bytes > prev.graph_pool_bytes * (1 + POOL_GROWTH_FRACTION):
                    p.regressions.append("graph_pool_bytes")
            if p.estimator_error_bytes is not None and prev.estimator_error_bytes is not None:
                grow = abs(p.estimator_error_bytes) - abs(prev.estimator_error_bytes)
                if grow > ESTIMATE_ERROR_GROWTH_BYTES:
                    p.regressions.append("estimator_error_bytes")
        points.append(p)
        prev = p
    return History(model=model, points=points)

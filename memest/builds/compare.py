"""Build A against build B: phases, capture stages, owners, runners and the KV outcome, as
deltas of the same figures (the seed's "main → PR" cells). The reporters and the service format a
:class:`Comparison`; owners are named by the caller's ``owner_label``. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field

from memest.analysis.owners import owner_key
from memest.analysis.ranks import capture_stages
from memest.analysis.stages import stage_bars
from memest.builds.runs import (
    Change,
    RunFacts,
    RunRef,
    build_label,
    config_changes,
    graph_pool_bytes,
    kv_sized_by,
    run_facts,
    run_ref,
    runner_counts,
)
from memest.schema import RunReport


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


def _owner_deltas(
    a: RunReport, b: RunReport, order: list[str], owner_label: Callable[[str], str]
) -> list[Delta]:
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


def compare(a: RunReport, b: RunReport, *, owner_label: Callable[[str], str] = str) -> Comparison:
    """Compare build ``a`` (e.g. main) with build ``b`` (e.g. the change); ``owner_label`` names
    an owner in the owner rows' labels (memest.reporters.owners.owner_label on every surface)."""
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
        owners=_owner_deltas(a, b, order, owner_label),
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

"""Estimates at the end of init: the comparison, the startup plan and the graph-figure note.

The arithmetic lives in memest.estimate; this module passes it what the hooks read.
"""

from __future__ import annotations

import os
from pathlib import Path

from memest.estimate.accounting import account
from memest.estimate.kv import kv_page_bytes
from memest.estimate.startup_plan import (
    graph_profiling_kept,
    plan_kv_bytes,
    plan_record,
    startup_plan_dir,
    startup_plan_document,
    write_startup_plan,
)
from memest.schema import (
    EstimateComparison,
    KvSizedBy,
    RunReport,
    StartupPlanInputs,
    VllmGraphProfile,
)
from memest_instrumentation.vllm.state import state


def explain_graph_figures(report: RunReport) -> None:
    """One note putting vLLM's graph estimate and "actual" beside memest's pool reading."""
    st = state()
    f = st.vllm
    capture = [p for p in report.phases if p.name == "capture"]
    if not capture or report.breakdown is None:
        return
    start, end = capture[-1].start, capture[-1].end
    pool = report.breakdown.graph_pool_growth_bytes
    live = max(end.torch_allocated_bytes - start.torch_allocated_bytes - pool, 0)
    st.notes.append(
        f"graph memory: vLLM estimate {f.cudagraph_estimate_bytes} B (profiling pass, {len(st.graph_profile.samples)} FULL samples extrapolated); "
        f"vLLM actual {f.cudagraph_actual_bytes} B (free-memory delta of capture_model: pool, allocations the "
        "capture keeps, allocator cache and memory outside PyTorch); memest: graph pool "
        f"{pool} B by reservation, plus {live} B of default-pool allocations made during the "
        "capture and still live"
    )


def estimate_comparison(report: RunReport) -> EstimateComparison:
    """Estimates side by side (memest.estimate.compare), with apply mode's measured terms."""
    st = state()
    gp = st.graph_profile
    profile = None
    if gp.measured_bytes is not None:
        profile = VllmGraphProfile(
            measured_bytes=gp.measured_bytes,
            full_samples_bytes=gp.samples[:2],
            full_graph_count=gp.full_graph_count,
        )
    fp = st.plan.fingerprint
    plan_inputs = None
    if fp and st.figures.init_free_bytes is not None:
        plan_inputs = StartupPlanInputs(
            fingerprint=fp, free_memory_baseline_bytes=st.figures.init_free_bytes
        )
    report.estimate = EstimateComparison(
        requested_bytes=st.vllm.requested_memory_bytes,
        vllm_graph_profile=profile,
        startup_plan=plan_inputs,
    )
    comparison: EstimateComparison | None = None
    try:
        from memest.estimate import compare

        comparison = compare(report, margin_bytes=st.settings.margin_bytes)
    except Exception as exc:
        st.notes.append(f"estimate comparison unavailable: {type(exc).__name__}: {exc}")
        comparison = report.estimate
    terms = st.apply_terms.terms
    if terms is not None:
        comparison.full_init = terms
        comparison.components.update(st.apply_terms.components())
    growable = st.vllm.extensible_kv
    by_memest = st.apply_terms.terms is not None or (
        growable is not None and growable.sized_by == "memest"
    )
    sized_by: KvSizedBy = "memest" if by_memest else "vllm"
    if st.plan.kv_cache_memory_bytes_given:
        sized_by = "memest-plan"
    report.kv_sized_by = sized_by
    st.notes.append(f"KV cache of this start sized by {sized_by}")
    return comparison


def write_plan(report: RunReport) -> None:
    """Write a vLLM 0.33.0 startup plan sized from this start's measured end state."""
    st = state()
    if st.settings.estimate == "off":
        return
    fp = st.plan.fingerprint
    usage = account(report).usage_bytes  # the one definition every surface shows
    requested = st.vllm.requested_memory_bytes
    spec = report.kv_cache
    baseline = st.figures.init_free_bytes
    if not fp or usage is None or requested is None or spec is None or not spec.num_blocks:
        st.notes.append("startup plan not written: fingerprint or end state missing")
        return
    if st.figures.profile_headroom_bytes is None:
        st.notes.append("startup plan not written: the profile run's activation peak is unknown")
        return
    page = kv_page_bytes(spec)  # a hybrid's: one block id over every group's layers
    kv_now = int(spec.num_blocks) * page
    # A plan start skips graph-memory profiling, so what that pass left allocated is not there.
    skipped = 0 if st.plan.kv_cache_memory_bytes_given else graph_profiling_kept(report)
    over = int(usage) - skipped - int(requested)
    kv_plan = plan_kv_bytes(
        over_budget_bytes=over,
        kv_now_bytes=kv_now,
        page_bytes=page,
        margin_bytes=st.settings.margin_bytes,
    )
    doc = startup_plan_document(
        fp, kv_plan, max(int(baseline or 0) - st.settings.plan_free_tolerance_bytes, 0)
    )
    root = Path(os.environ.get("VLLM_CACHE_ROOT") or _vllm_cache_root())
    path = write_startup_plan(startup_plan_dir(root), doc)
    st.plan.path, st.plan.kv_cache_memory_bytes = str(path), kv_plan
    st.notes.append(
        f"startup plan {path}: next start with VLLM_ENABLE_STARTUP_PLAN=1, or pass "
        f"--kv-cache-memory-bytes {kv_plan}"
    )
    if report.estimate is not None:
        report.estimate.records.append(
            plan_record(
                kv_plan_bytes=kv_plan,
                page_bytes=page,
                block_size=spec.block_size,
                usage_minus_budget_bytes=over + kv_plan - kv_now,
                note=f"--kv-cache-memory-bytes {kv_plan} (startup plan {path.name}); "
                f"{skipped} B that graph-memory profiling left allocated are not in a plan start",
            )
        )
    report.notes = list(st.notes)


def _vllm_cache_root() -> str:
    import vllm.envs as envs

    return str(envs.VLLM_CACHE_ROOT)

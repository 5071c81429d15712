"""End of init on each rank: the last reading, the report, its file and push, the startup plan."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memest.identity import config_fingerprint, with_default_label
from memest.schema import (
    Breakdown,
    BuildInfo,
    CapturePlan,
    EstimateComparison,
    EstimateRecord,
    GpuInfo,
    KVCacheSpec,
    PhaseRecord,
    PhaseSplit,
    RetainedRow,
    RunConfig,
    RunReport,
    StageGrowth,
    StartupPlanInputs,
    VllmFigures,
    VllmGraphProfile,
)
from memest_instrumentation.vllm import measure, sink
from memest_instrumentation.vllm.env import derive_run_id
from memest_instrumentation.vllm.state import guarded, logger, state


def end_of_init(worker: Any) -> RunReport | None:
    """Close the start: settle, read, analyze, write, push, plan. Runs once per process."""
    st = state()
    if st.finalized:
        return None
    st.finalized = True
    measure.settle()
    end = measure.reading()
    st.phases.append(PhaseRecord(name="end", start=end, end=end))
    pool_usage = guarded("report", measure.pool_usage) or {}
    usage = (end.device_used_bytes or 0) + int(st.figures.get("profile_headroom_bytes", 0))
    st.figures["usage_end_bytes"] = usage
    report = build_report(worker, end_pool_usage=pool_usage)
    guarded("startup_plan", write_plan, report)
    path = guarded("report_file", sink.write_report, st.settings, report)
    if path is not None:
        logger.info("memest report: %s", path)
    if st.settings.service_url:
        result = guarded("push", sink.push, st.settings, report)
        if result is not None and not result[0]:
            for problem in result[1]:
                st.fail("push", RuntimeError(problem))
            report.hook_errors = _errors()
            guarded("report_file", sink.write_report, st.settings, report)
    return report


def _capture_plans(config: RunConfig, gpu: GpuInfo | None) -> list[CapturePlan]:
    from memest_instrumentation.vllm import plans

    sm100 = bool(gpu and gpu.compute_capability and gpu.compute_capability.startswith("10."))
    return plans.capture_plans(config, sm100=sm100, gpu=gpu.name if gpu else "")


def _breakdown(end_pool_usage: dict[str, tuple[int, int]]) -> Breakdown:
    st = state()
    from memest_instrumentation.vllm import recorder

    history = guarded("analysis", recorder.analyze_history)
    splits = [
        PhaseSplit(
            phase=p.name,
            total_added_bytes=(p.end.device_used_bytes or 0) - (p.start.device_used_bytes or 0),
            graph_pool_bytes=measure.private_pool_bytes(p.end)
            - measure.private_pool_bytes(p.start),
            other_torch_bytes=(p.end.torch_reserved_bytes - p.start.torch_reserved_bytes)
            - (measure.private_pool_bytes(p.end) - measure.private_pool_bytes(p.start)),
            outside_torch_bytes=(
                (p.end.device_used_bytes or 0)
                - (p.start.device_used_bytes or 0)
                - (p.end.torch_reserved_bytes - p.start.torch_reserved_bytes)
            ),
        )
        for p in st.phases
        if p.name != "end"
    ]
    capture = [p for p in st.phases if p.name == "capture"]
    pool = st.figures.get("capture_pool")
    pool_growth = 0
    stages = list(st.stages)
    if capture:
        pool_growth = max(
            measure.private_pool_bytes(capture[-1].end, pool)
            - measure.private_pool_bytes(capture[-1].start, pool),
            0,
        )
        staged = sum(s.pool_growth_bytes for s in stages if s.phase == "capture")
        if staged < pool_growth:
            stages.append(
                StageGrowth(stage="between_stages", pool_growth_bytes=pool_growth - staged)
            )
    retained: list[RetainedRow] = []
    if pool is not None and pool in end_pool_usage:
        retained.append(
            RetainedRow(
                stage="capture",
                owner="graph_pool_live_blocks",
                bytes=end_pool_usage[pool][1],
            )
        )
    if capture:
        live = capture[-1].end.torch_allocated_bytes - capture[-1].start.torch_allocated_bytes
        in_pool = end_pool_usage.get(pool or "", (0, 0))[1]
        retained.append(
            RetainedRow(
                stage="capture",
                owner="default_pool_allocated_during_capture",
                bytes=max(live - in_pool, 0),
            )
        )
    if history is not None:
        # Stage rows stay the edge readings (reservation of the capture pool at stage edges);
        # triggers, owners and the retained view come from the allocator history.
        history.phases = history.phases or splits
        for row in history.stages:
            st.notes.append(
                f"history stage row: {row.phase}/{row.stage} pool growth "
                f"{row.pool_growth_bytes} B, default-pool growth {row.default_pool_growth_bytes} B"
            )
        history.stages = stages
        history.graph_pool_growth_bytes = pool_growth
        history.retained = list(history.retained) + retained
        history.warnings.append(
            "stages: capture-pool reservation at stage edges; triggers/retained: allocator history"
        )
        return history
    return Breakdown(
        phases=splits,
        stages=stages,
        retained=retained,
        graph_pool_growth_bytes=pool_growth,
        warnings=[
            "stage growth measured by pool reservation at stage edges; no allocator history, "
            "so no trigger table or per-owner split"
        ],
    )


def build_report(worker: Any, *, end_pool_usage: dict[str, tuple[int, int]]) -> RunReport:
    """Assemble the RunReport of this rank from what the hooks measured."""
    st = state()
    if not st.run_id:
        st.run_id = derive_run_id()
    cfg = dict(st.config)
    cfg.setdefault("model", "unknown")
    config = RunConfig(**cfg)
    gpu = guarded("report", _gpu_info)
    plans = guarded("capture_plans", _capture_plans, config, gpu) or []
    kv: KVCacheSpec | None = None
    num_blocks = st.figures.get("num_gpu_blocks") or st.kv.get("num_blocks")
    if "block_size" in st.kv:
        kv = KVCacheSpec(
            kind="full_attention"
            if st.kv.get("kind") == "FullAttentionSpec"
            else str(st.kv["kind"]),
            num_layers=st.kv["num_layers"],
            num_kv_heads=st.kv["num_kv_heads"],
            head_size=st.kv["head_size"],
            dtype=st.kv["dtype"],
            dtype_bytes=st.kv["dtype_bytes"],
            block_size=st.kv["block_size"],
            page_size_bytes=st.kv["page_size_bytes"],
            num_blocks=num_blocks,
            kv_tokens=num_blocks * st.kv["block_size"] if num_blocks is not None else None,
            extra={
                "kv_buffer_bytes": st.kv.get("kv_buffer_bytes"),
                "uniform": st.kv.get("uniform"),
            },
        )
    f = st.figures
    figures = VllmFigures(
        requested_memory_bytes=f.get("requested_memory_bytes"),
        weights_bytes=f.get("weights_bytes"),
        non_kv_cache_memory_bytes=f.get("non_kv_cache_memory_bytes"),
        peak_activation_bytes=f.get("peak_activation_bytes"),
        cudagraph_estimate_bytes=f.get("cudagraph_estimate_bytes"),
        cudagraph_actual_bytes=f.get("cudagraph_actual_bytes"),
        available_kv_cache_bytes=f.get("available_kv_cache_bytes"),
        num_gpu_blocks=num_blocks,
    )
    breakdown = guarded("analysis", _breakdown, end_pool_usage)
    report = RunReport(
        run_id=st.run_id,
        rank=st.rank,
        world_size=st.world_size,
        model=config.model,
        build=with_default_label(_build_info()),
        gpu=gpu,
        config=config,
        config_fingerprint=config_fingerprint(config),
        capture_plans=plans,
        kv_cache=kv,
        phases=list(st.phases),
        breakdown=breakdown,
        vllm=figures,
        notes=list(st.notes),
        hook_errors=_errors(),
    )
    report.estimate = guarded("estimate", _estimate, report)
    guarded("report", _explain_graph_figures, report)
    report.notes = list(st.notes)
    report.hook_errors = _errors()
    return report


def _errors() -> list[str]:
    st = state()
    return [
        msg if st.error_counts.get(msg, 1) == 1 else f"{msg} (x{st.error_counts[msg]})"
        for msg in st.hook_errors
    ]


def _explain_graph_figures(report: RunReport) -> None:
    """One note putting vLLM's graph estimate and "actual" beside memest's pool reading."""
    st = state()
    f = st.figures
    capture = [p for p in report.phases if p.name == "capture"]
    if not capture or report.breakdown is None:
        return
    start, end = capture[-1].start, capture[-1].end
    pool = report.breakdown.graph_pool_growth_bytes
    live = max(end.torch_allocated_bytes - start.torch_allocated_bytes - pool, 0)
    st.notes.append(
        "graph memory: vLLM estimate {est} B (profiling pass, {n} FULL samples extrapolated); "
        "vLLM actual {act} B (free-memory delta of capture_model: pool, allocations the "
        "capture keeps, allocator cache and memory outside PyTorch); memest: graph pool "
        "{pool} B by reservation, plus {live} B of default-pool allocations made during the "
        "capture and still live".format(
            est=f.get("cudagraph_estimate_bytes"),
            n=len(st.graph_profile.get("samples", [])),
            act=f.get("cudagraph_actual_bytes"),
            pool=pool,
            live=live,
        )
    )


def _estimate(report: RunReport) -> EstimateComparison:
    st = state()
    gp = st.graph_profile
    profile = None
    if "measured_bytes" in gp:
        profile = VllmGraphProfile(
            measured_bytes=int(gp["measured_bytes"]),
            full_samples_bytes=list(gp.get("samples", []))[:2],
            full_graph_count=int(gp.get("full_graph_count", 0)),
        )
    fp = st.plan.get("fingerprint")
    plan_inputs = None
    if fp and st.figures.get("init_free_bytes") is not None:
        plan_inputs = StartupPlanInputs(
            fingerprint=fp, free_memory_baseline_bytes=int(st.figures["init_free_bytes"])
        )
    report.estimate = EstimateComparison(
        requested_bytes=st.figures.get("requested_memory_bytes"),
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
    terms = st.apply_terms.get("terms")
    if terms is not None:
        comparison.full_init = terms
        comparison.components.update(
            {k: int(v) for k, v in st.apply_terms.items() if k.endswith("_bytes")}
        )
    usage = st.figures.get("usage_end_bytes")
    requested = st.figures.get("requested_memory_bytes")
    spec = report.kv_cache
    if usage is not None and requested is not None and spec is not None and spec.num_blocks:
        estimator = "memest" if st.apply_terms.get("terms") is not None else "vllm"
        if st.plan.get("kv_cache_memory_bytes_given"):
            estimator = "memest-plan"
        comparison.records.append(
            EstimateRecord(
                estimator="measured",
                cudagraph_estimate_bytes=st.figures.get("cudagraph_estimate_bytes"),
                kv_cache_bytes=int(spec.num_blocks) * int(spec.page_size_bytes or 0),
                kv_tokens=spec.kv_tokens,
                usage_minus_budget_bytes=int(usage) - int(requested),
                note=f"this start, KV sized by {estimator}: device memory in use at the end of "
                "init after empty_cache plus the profile run's activation peak, minus budget",
            )
        )
    return comparison


def write_plan(report: RunReport) -> None:
    """Write a vLLM 0.33.0 startup plan sized from this start's measured end state."""
    st = state()
    if st.settings.estimate == "off":
        return
    fp = st.plan.get("fingerprint")
    usage = st.figures.get("usage_end_bytes")
    requested = st.figures.get("requested_memory_bytes")
    spec = report.kv_cache
    baseline = st.figures.get("init_free_bytes")
    if not fp or usage is None or requested is None or spec is None or not spec.num_blocks:
        st.notes.append("startup plan not written: fingerprint or end state missing")
        return
    if "profile_headroom_bytes" not in st.figures:
        st.notes.append("startup plan not written: the profile run's activation peak is unknown")
        return
    page = int(spec.page_size_bytes or 0)
    kv_now = int(spec.num_blocks) * page
    # A plan start skips graph-memory profiling, so what that pass left allocated is not there.
    skipped = 0 if st.plan.get("kv_cache_memory_bytes_given") else graph_profiling_kept(report)
    over = int(usage) - skipped - int(requested) + st.settings.margin_bytes
    kv_plan = ((kv_now - over) // page) * page
    from memest.estimate import startup_plan_dir, startup_plan_document, write_startup_plan

    doc = startup_plan_document(
        fp, kv_plan, max(int(baseline or 0) - st.settings.plan_free_tolerance_bytes, 0)
    )
    root = Path(os.environ.get("VLLM_CACHE_ROOT") or _vllm_cache_root())
    path = write_startup_plan(startup_plan_dir(root), doc)
    st.plan.update(path=str(path), kv_cache_memory_bytes=kv_plan)
    st.notes.append(
        f"startup plan {path}: next start with VLLM_ENABLE_STARTUP_PLAN=1, or pass "
        f"--kv-cache-memory-bytes {kv_plan}"
    )
    if report.estimate is not None:
        report.estimate.records.append(
            EstimateRecord(
                estimator="memest-plan",
                kv_cache_bytes=kv_plan,
                kv_tokens=(kv_plan // page) * spec.block_size if page else None,
                usage_minus_budget_bytes=int(usage) - skipped - kv_now + kv_plan - int(requested),
                note=f"--kv-cache-memory-bytes {kv_plan} (startup plan {path.name}); "
                f"{skipped} B that graph-memory profiling left allocated are not in a plan start",
            )
        )
    report.notes = list(st.notes)


def graph_profiling_kept(report: RunReport) -> int:
    """Bytes allocated during graph-memory profiling and still live at the end of init.

    From the allocator history's retained view when it was recorded (Inductor output buffers
    of the profiling capture, for instance); else the allocated growth over the profiling pass.
    """
    bd = report.breakdown
    if bd is not None and bd.event_count and any(s.phase == "graph_profiling" for s in bd.stages):
        return sum(r.bytes for r in bd.retained if r.phase == "graph_profiling")
    gp = [p for p in report.phases if p.name == "graph_profiling.total"]
    if not gp:
        return 0
    return max(gp[-1].end.torch_allocated_bytes - gp[-1].start.torch_allocated_bytes, 0)


def _vllm_cache_root() -> str:
    import vllm.envs as envs

    return str(envs.VLLM_CACHE_ROOT)


def _build_info() -> BuildInfo:
    import memest

    info = BuildInfo(memest_version=getattr(memest, "__version__", None))
    try:
        import torch

        info.torch_version = str(torch.__version__)
        info.cuda_version = torch.version.cuda
    except Exception:
        pass
    try:
        import vllm

        info.vllm_version = str(vllm.__version__)
    except Exception:
        pass
    return info


def _gpu_info() -> GpuInfo | None:
    props = measure.gpu_properties()
    if props is None:
        return None
    name, total, capability = props
    return GpuInfo(name=name, total_bytes=total, compute_capability=capability)

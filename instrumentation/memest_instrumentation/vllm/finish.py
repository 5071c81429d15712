"""End of init on each rank: the last reading, the report, its file and push, the startup plan.

The breakdown is built in ``breakdown``, the estimates and the plan in ``estimates``.
"""

from __future__ import annotations

from typing import Any

from memest.identity import config_fingerprint, with_default_label
from memest.schema import (
    BuildInfo,
    CapturePlan,
    GpuInfo,
    KVCacheSpec,
    PhaseRecord,
    RunConfig,
    RunReport,
    VllmFigures,
)
from memest_instrumentation.vllm import measure, sink
from memest_instrumentation.vllm.breakdown import start_breakdown
from memest_instrumentation.vllm.env import derive_run_id
from memest_instrumentation.vllm.estimates import (
    estimate_comparison,
    explain_graph_figures,
    write_plan,
)
from memest_instrumentation.vllm.state import guarded, logger, state


def end_of_init(worker: Any) -> RunReport | None:
    """Close the start: settle, read, analyze, write, push, plan. Runs once per process."""
    st = state()
    if st.finalized:
        return None
    st.finalized = True
    measure.settle(collect_garbage=True)
    end = measure.reading()
    st.phases.append(PhaseRecord(name="end", start=end, end=end))
    st.notes.append(_work_note())
    pool_usage = guarded("report", measure.pool_usage) or {}
    if not st.shedding:
        from memest_instrumentation.vllm import inductor

        st.compiled_code = guarded(
            "compiled_code", inductor.collect, getattr(worker, "vllm_config", None)
        )
    from memest_instrumentation.vllm import dims

    guarded("mla_prefill", dims.record_mla_prefill, getattr(worker, "vllm_config", None))
    guarded("gdn_prefill", dims.record_gdn_prefill, getattr(worker, "vllm_config", None))
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


def _work_note() -> str:
    """memest's own seconds in this start (settle and the end of init not yet counted)."""
    st = state()
    top = sorted(st.work_s.items(), key=lambda kv: -kv[1])[:4]
    parts = ", ".join(f"{hook} {seconds:.2f} s" for hook, seconds in top)
    return f"memest's own work before the end of init: {st.work_seconds():.2f} s ({parts})"


def _capture_plans(config: RunConfig, gpu: GpuInfo | None) -> list[CapturePlan]:
    from memest_instrumentation.vllm import plans

    sm100 = bool(gpu and gpu.compute_capability and gpu.compute_capability.startswith("10."))
    return plans.capture_plans(config, sm100=sm100, gpu=gpu.name if gpu else "")


def build_report(worker: Any, *, end_pool_usage: dict[str, tuple[int, int]]) -> RunReport:
    """Assemble the RunReport of this rank from what the hooks measured."""
    st = state()
    if not st.run_id:
        st.run_id = derive_run_id()
    config = st.config or RunConfig(model="unknown")
    gpu = guarded("report", _gpu_info)
    plans = guarded("capture_plans", _capture_plans, config, gpu) or []
    num_blocks = st.vllm.num_gpu_blocks or st.kv.num_blocks
    kv = _kv_spec(num_blocks)
    figures = VllmFigures.model_validate({**st.vllm.model_dump(), "num_gpu_blocks": num_blocks})
    breakdown = guarded("analysis", start_breakdown, end_pool_usage)
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
        compiled_code=st.compiled_code,
        notes=list(st.notes),
        hook_errors=_errors(),
    )
    report.estimate = guarded("estimate", estimate_comparison, report)
    guarded("report", explain_graph_figures, report)
    report.notes = list(st.notes)
    report.hook_errors = _errors()
    return report


def _kv_spec(num_blocks: int | None) -> KVCacheSpec | None:
    """vLLM's KV-cache spec with this start's block count and backing buffer."""
    kv = state().kv
    if kv.spec is None:
        return None
    return kv.spec.model_copy(
        update={
            "num_blocks": num_blocks,
            "kv_tokens": num_blocks * kv.spec.block_size if num_blocks is not None else None,
            "extra": {"kv_buffer_bytes": kv.kv_buffer_bytes or None, **kv.spec.extra},
        }
    )


def _errors() -> list[str]:
    st = state()
    return [
        msg if st.error_counts.get(msg, 1) == 1 else f"{msg} (x{st.error_counts[msg]})"
        for msg in st.hook_errors
    ]


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

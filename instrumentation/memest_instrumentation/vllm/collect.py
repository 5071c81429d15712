"""Read the resolved configuration and vLLM's own figures from a running worker."""

from __future__ import annotations

from typing import Any

from memest.identity import public_model_name
from memest.schema import KVCacheSpec, RunConfig
from memest_instrumentation.vllm.state import guarded, state


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def baseline(worker: Any) -> None:
    """After Worker.init_device: rank, world size, vLLM's baseline and budget."""
    st = state()
    st.rank = int(getattr(worker, "rank", 0) or 0)
    pc = getattr(worker, "parallel_config", None)
    st.world_size = int(getattr(pc, "world_size", 1) or 1)
    snap = getattr(worker, "init_snapshot", None)
    st.figures.init_free_bytes = _int(getattr(snap, "free_memory", None))
    st.vllm.requested_memory_bytes = _int(getattr(worker, "requested_memory", None))
    from memest_instrumentation.vllm import recorder

    guarded("recorder", recorder.ensure_started, "init")


def fingerprint(worker: Any) -> None:
    """Before determine_available_memory: the startup-plan fingerprint vLLM computes there.

    Taken before initialize_kv_cache can rewrite cudagraph_mode, so it is the fingerprint the
    next start computes when it looks for a plan.
    """
    st = state()
    st.plan.kv_cache_memory_bytes_given = _int(
        getattr(worker.cache_config, "kv_cache_memory_bytes", None)
    )
    st.plan.fingerprint = compute_fingerprint(worker)


def compute_fingerprint(worker: Any) -> str:
    """vLLM's own plan fingerprint for this worker (vllm/v1/worker/startup_plan.py)."""
    from vllm.v1.worker.startup_plan import compute_plan_fingerprint

    return str(
        compute_plan_fingerprint(worker.vllm_config, worker.rank, worker.parallel_config.world_size)
    )


def _text(value: Any) -> str | None:
    """A config value as text (vLLM's str enums and literals); None stays None."""
    return None if value is None else str(getattr(value, "value", value))


def resolved_utilization(cache_config: Any) -> float:
    """gpu_memory_utilization as vLLM uses it: 0.34 leaves the field unset (None) and resolves
    it by sizing mode (1.0 with the growable KV cache, 0.92 without)."""
    resolved = getattr(cache_config, "resolved_gpu_memory_utilization", None)
    value = cache_config.gpu_memory_utilization if resolved is None else resolved
    return float(value)


def read_config(worker: Any) -> None:
    """The resolved configuration (hook map 3.4)."""
    st = state()
    vc = worker.vllm_config
    cc = vc.compilation_config
    sc = vc.scheduler_config
    spec = getattr(vc, "speculative_config", None)
    mc = vc.model_config
    st.config = RunConfig(
        model=public_model_name(getattr(mc, "served_model_name", None), getattr(mc, "model", "")),
        max_num_seqs=_int(getattr(sc, "max_num_seqs", None)),
        max_num_batched_tokens=_int(getattr(sc, "max_num_batched_tokens", None)),
        max_model_len=_int(getattr(mc, "max_model_len", None)),
        gpu_memory_utilization=resolved_utilization(vc.cache_config),
        tensor_parallel_size=int(getattr(vc.parallel_config, "tensor_parallel_size", 1) or 1),
        speculative_method=getattr(spec, "method", None) if spec is not None else None,
        num_speculative_tokens=int(getattr(spec, "num_speculative_tokens", 0) or 0)
        if spec is not None
        else 0,
        cudagraph_capture_sizes=[int(s) for s in (cc.cudagraph_capture_sizes or [])],
        max_cudagraph_capture_size=_int(cc.max_cudagraph_capture_size),
        cudagraph_mode=str(getattr(cc.cudagraph_mode, "name", cc.cudagraph_mode)),
        model_runner="v2" if getattr(worker, "use_v2_model_runner", False) else "v1",
        compilation_config={"mode": str(getattr(cc, "mode", ""))},
        kv_cache_dtype=_text(getattr(vc.cache_config, "cache_dtype", None)),
        quantization=_text(getattr(mc, "quantization", None)),
    )
    from memest_instrumentation.vllm import dims

    guarded("model_dims", dims.record, vc)


_COMPILE_COUNTERS = (
    "num_inductor_compiles",
    "num_eager_compiles",
    "num_aot_compiles",
    "num_compiled_artifacts_saved",
)


def compile_count() -> int | None:
    """vLLM's count of compilations so far (None when vLLM's counter is not importable)."""
    try:
        from vllm.compilation.counter import compilation_counter
    except Exception:
        return None
    return sum(int(getattr(compilation_counter, name, 0) or 0) for name in _COMPILE_COUNTERS)


def vllm_headroom(worker: Any) -> int | None:
    """vLLM's own transient_peak_headroom, recovered from the worker after profiling.

    ``peak_activation_memory`` is that headroom plus the graph estimate when
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS applies it (the default).
    """
    peak = _int(getattr(worker, "peak_activation_memory", None))
    if peak is None:
        return None
    applied = 0
    try:
        import vllm.envs as envs

        if envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS:
            applied = _int(getattr(worker, "cudagraph_memory_estimate", None)) or 0
    except Exception:
        applied = _int(getattr(worker, "cudagraph_memory_estimate", None)) or 0
    return max(peak - applied, 0)


def vllm_budget(worker: Any, result: Any) -> None:
    """After determine_available_memory: vLLM's non-KV memory, graph estimate, KV bytes."""
    st = state()
    consumed = _int(getattr(worker, "total_consumed", None))
    peak = _int(getattr(worker, "peak_activation_memory", None))
    estimate = _int(getattr(worker, "cudagraph_memory_estimate", None))
    if st.figures.profile_headroom_bytes is None:
        # memest's profile_run hook did not run (its target was missing or wrapped by another
        # plugin); vLLM's own figure is the same quantity, so the estimate keeps its term.
        headroom = vllm_headroom(worker)
        if headroom is not None:
            st.figures.profile_headroom_bytes = headroom
            st.figures.profile_headroom_source = "vllm"
            st.notes.append(
                f"profile-run activation peak taken from vLLM's own profiling ({headroom} B): "
                "memest's profile_run hook did not measure it"
            )
    v = st.vllm
    v.weights_bytes = _int(getattr(worker.model_runner, "model_memory_usage", None))
    v.peak_activation_bytes = peak
    v.cudagraph_estimate_bytes = estimate
    v.available_kv_cache_bytes = _int(getattr(worker, "available_kv_cache_memory_bytes", None))
    headroom = st.figures.profile_headroom_bytes
    if consumed is not None and headroom is not None:
        v.non_kv_cache_memory_bytes = consumed + headroom


def after_kv(worker: Any, kv_cache_config: Any) -> None:
    """After initialize_from_config: block count and the KV-cache spec."""
    st = state()
    st.vllm.num_gpu_blocks = _int(getattr(worker.cache_config, "num_gpu_blocks", None))
    specs = worker.get_kv_cache_spec()
    layers = list(specs.values())
    if not layers:
        return
    first = layers[0]
    dtype = getattr(first, "dtype", None)
    kind = type(first).__name__
    st.kv.spec = KVCacheSpec(
        kind="full_attention" if kind == "FullAttentionSpec" else kind,
        num_layers=len(layers),
        num_kv_heads=_int(getattr(first, "num_kv_heads", 0)) or 0,
        head_size=_int(getattr(first, "head_size", 0)) or 0,
        dtype=str(dtype).replace("torch.", "") if dtype is not None else "bfloat16",
        dtype_bytes=int(getattr(dtype, "itemsize", 2) or 2),
        block_size=int(first.block_size),
        page_size_bytes=sum(int(s.page_size_bytes) for s in layers),
        extra={"uniform": len({(type(s), int(s.page_size_bytes)) for s in layers}) == 1},
    )

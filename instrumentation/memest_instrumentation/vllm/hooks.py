"""The wrappers around vLLM's startup methods, and the patch lists that install them per release.

Phase and stage windows live in ``windows``, stage detection in ``detect``, memest's second,
warm profile pass in ``warm_pass``.

Every wrapper calls the original unchanged and returns its value; memest's own work runs in
``guarded`` blocks, so a failing hook is logged once, kept in ``report.hook_errors`` and vLLM goes
on. Targets and line numbers: shared hook map (vllm-0.33-hooks.md), sections 1-3.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from memest.schema import PhaseRecord
from memest.snapshot.tags import pool_key
from memest_instrumentation.vllm import measure, plan_path
from memest_instrumentation.vllm.detect import role_of, stage_of
from memest_instrumentation.vllm.extensible import (
    after_extend,
    growable,
    wrap_measure_kv_cache_blocks,
    wrap_measure_kv_cache_bytes,
)
from memest_instrumentation.vllm.patches import Patch
from memest_instrumentation.vllm.state import guarded, state
from memest_instrumentation.vllm.targets import (
    ADAPTORS,
    ATTN,
    AV,
    CG,
    EXTENSIBLE,
    W1,
    W2,
    WORKER,
)
from memest_instrumentation.vllm.warm_pass import warm_profile_peak
from memest_instrumentation.vllm.windows import (
    begin_phase,
    close_stage,
    end_phase,
    enter_stage,
    phase_wrapper,
)


def wrap_cg_capture(orig: Callable[..., Any]) -> Callable[..., Any]:
    """CudaGraphManager.capture: the single choke point of every MRV2 graph family."""

    @functools.wraps(orig)
    def wrapper(self: Any, create_forward_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        st = state()
        if not st.settings.enabled:
            return orig(self, create_forward_fn, *args, **kwargs)
        desc_text = kwargs.get("progress_bar_desc", args[0] if args else "Capturing CUDA graphs")
        role = guarded("capture_stage", role_of, str(desc_text)) or "target"
        pool = guarded("capture_stage", pool_key, getattr(self, "pool", None))

        def tagged(desc: Any, warmup: bool) -> Any:
            stage = guarded("capture_stage", stage_of, role, desc)
            if stage is not None and warmup:
                guarded(
                    "capture_stage", enter_stage, stage, pool, getattr(desc, "num_tokens", None)
                )
            return create_forward_fn(desc, warmup)

        if st.graph_profile.lift_full_limit and st.current_phase == "graph_profiling":
            if getattr(self, "_max_full_descs_to_capture", None) is not None:
                self._max_full_descs_to_capture = None
        try:
            return orig(self, tagged, *args, **kwargs)
        finally:
            guarded("capture_stage", close_stage)

    return wrapper


def wrap_v1_warmup_and_capture(orig: Callable[..., Any]) -> Callable[..., Any]:
    """MRV1: stage tags per ``_warmup_and_capture(desc, cudagraph_runtime_mode, ...)`` call."""

    @functools.wraps(orig)
    def wrapper(self: Any, desc: Any, cudagraph_runtime_mode: Any, *args: Any, **kw: Any) -> Any:
        st = state()
        if st.settings.enabled:
            mode = getattr(cudagraph_runtime_mode, "name", str(cudagraph_runtime_mode))
            stage = "target.piecewise" if mode == "PIECEWISE" else "target.full"
            guarded("capture_stage", enter_stage, stage, None, getattr(desc, "num_tokens", None))
        return orig(self, desc, cudagraph_runtime_mode, *args, **kw)

    return wrapper


def wrap_av_batches(orig: Callable[..., Any]) -> Callable[..., Any]:
    """AdaptiveVerificationManager.batches_to_profile: the post-capture AV profiling runs.

    They run eagerly after the graphs are captured (real capture only); their allocations land
    in the default pool, and what they leave cached is what vLLM's "actual" wrongly counts as
    graph memory, so they get a stage of their own.
    """

    @functools.wraps(orig)
    def wrapper(self: Any, capture_sizes: list[int], *args: Any, **kwargs: Any) -> Any:
        batches = orig(self, capture_sizes, *args, **kwargs)
        if not state().settings.enabled:
            return batches

        def tagged() -> Any:
            guarded("capture_stage", enter_stage, "target.av.profiling", None, None)
            try:
                yield from batches
            finally:
                guarded("capture_stage", close_stage)

        return tagged()

    return wrapper


# --------------------------------------------------------------------------- worker hooks
def _after_init_device(self: Any, args: Any, kwargs: Any, result: Any, record: Any) -> None:
    from memest_instrumentation.vllm import collect

    collect.baseline(self)


def _before_determine(self: Any, args: Any, kwargs: Any) -> None:
    from memest_instrumentation.vllm import collect

    guarded("config", collect.read_config, self)
    guarded("startup_plan", collect.fingerprint, self)


def _after_determine(self: Any, args: Any, kwargs: Any, result: Any, record: Any) -> Any:
    from memest_instrumentation.vllm import apply, collect

    collect.vllm_budget(self, result)
    st = state()
    # The warm pass stays on in the default mode (MEMEST_ESTIMATE=plan): the startup plan written
    # at the end of init, like apply's budget, takes its activation term from this pass (vLLM's
    # own peak counts compile transients and misses the reservation), and a plan start skips
    # vLLM's profiling, so no later start could measure it. MEMEST_ESTIMATE=off skips it.
    if st.settings.estimate != "off" and st.figures.profile_headroom_bytes is not None:
        if st.shedding:
            st.notes.append("warm profile pass skipped (work budget spent)")
        else:
            guarded("warm_profile", warm_profile_peak, self)
    if state().settings.estimate == "apply":
        if growable(self):
            # vLLM 0.34 sizes a growable cache after capture: memest applies its terms there
            # (extensible.py); what this returns is only the cache's reserved capacity.
            return None
        return apply.applied_budget(self, result)
    return None


def _before_graph_profiling(self: Any, args: Any, kwargs: Any) -> None:
    from memest_instrumentation.vllm import recorder

    st = state()
    st.graph_profile.lift_full_limit = st.settings.estimate == "apply"
    guarded("recorder", recorder.ensure_started, "graph_profiling")


def _before_v1_capture(self: Any, args: Any, kwargs: Any) -> None:
    from memest_instrumentation.vllm import recorder

    recorder.ensure_started("capture")


def _after_graph_profiling(self: Any, args: Any, kwargs: Any, result: Any, record: Any) -> None:
    st = state()
    st.graph_profile.lift_full_limit = False


def _before_profile_run(self: Any, args: Any, kwargs: Any) -> None:
    from memest_instrumentation.vllm import collect

    # Peak stats start here, as inside vLLM's memory_profiling (also when a plan skipped it).
    measure.reset_peak()
    st = state()
    st.figures.compiles_before_profile_run = collect.compile_count()
    st.plan.split_scope = plan_path.enter(self)


def _after_profile_run(self: Any, args: Any, kwargs: Any, result: Any, record: Any) -> None:
    from memest_instrumentation.vllm import collect

    st = state()
    scope, st.plan.split_scope = st.plan.split_scope, None
    if scope is not None:
        plan_path.leave(scope)
        note = "profile run on the kv_cache_memory_bytes path held to vLLM's 20 MiB split limit"
        st.notes.append(note + " and emptied after, as its profiling path does")
    before, st.figures.compiles_before_profile_run = st.figures.compiles_before_profile_run, None
    after = collect.compile_count()
    if before is not None and after is not None and after > before:
        st.figures.profile_run_compiled = after - before
    if record is not None:
        st.figures.profile_headroom_bytes = max(
            record.end.torch_allocated_peak_bytes - record.end.torch_allocated_bytes, 0
        )
        st.figures.profile_headroom_source = "memest"


def _after_init_from_config(self: Any, args: Any, kwargs: Any, result: Any, record: Any) -> None:
    from memest_instrumentation.vllm import collect

    collect.after_kv(self, args[0] if args else kwargs.get("kv_cache_config"))


def _after_compile(self: Any, args: Any, kwargs: Any, result: Any, record: Any) -> None:
    from memest_instrumentation.vllm import finish

    if growable(self):
        return  # the report follows Worker.extend_kv_cache, once the committed size is known
    finish.end_of_init(self)


# --------------------------------------------------------------------------- runner hooks
def wrap_capture_model(orig: Callable[..., Any]) -> Callable[..., Any]:
    """capture_model: the real capture (phase 'capture'), or the profiling pass inside it."""

    @functools.wraps(orig)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        st = state()
        if not st.settings.enabled:
            return orig(self, *args, **kwargs)
        profile_only = bool(kwargs.get("profile_only", False))
        name = "graph_profiling.capture" if profile_only else "capture"
        token = None
        if profile_only:
            guarded("graph_profiling", measure.settle)
            st.capture_pool = guarded("graph_profiling", _global_pool_key)
            token = guarded("graph_profiling", begin_phase, "graph_profiling")
        else:
            from memest_instrumentation.vllm import recorder

            guarded("recorder", recorder.ensure_started, "capture")
            token = guarded("capture", begin_phase, "capture")
        result = orig(self, *args, **kwargs)
        if token is not None:
            rec = guarded(name, end_phase, "graph_profiling" if profile_only else "capture", token)
            if rec is not None:
                guarded(name, _note_capture, profile_only, rec, result)
        return result

    return wrapper


def _global_pool_key() -> str | None:
    from vllm.platforms import current_platform

    pool = type(current_platform)._global_graph_pool
    return None if pool is None else pool_key(pool)


def _note_capture(profile_only: bool, rec: PhaseRecord, result: Any) -> None:
    st = state()
    if profile_only:
        # Settled copy of the end reading: what the profiling capture keeps.
        measure.settle()
        settled = measure.reading()
        pool = st.capture_pool
        gp = st.graph_profile
        gp.measured_bytes, gp.start, gp.end_settled, gp.pool = int(result), rec.start, settled, pool
    else:
        st.vllm.cudagraph_actual_bytes = int(result)
        st.figures.capture_pool = _global_pool_key()


def wrap_initialize_kv_cache(orig: Callable[..., Any]) -> Callable[..., Any]:
    """initialize_kv_cache: phase 'kv_cache_alloc', or runner buffers of the profiling KV cache."""

    @functools.wraps(orig)
    def wrapper(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        st = state()
        if not st.settings.enabled:
            return orig(self, kv_cache_config, *args, **kwargs)
        profiling = bool(kwargs.get("is_profiling", args[0] if args else False))
        st.profiling_kv = profiling
        name = "graph_profiling.kv" if profiling else "kv_cache_alloc"
        token = guarded("kv_cache_alloc", begin_phase, name)
        try:
            return orig(self, kv_cache_config, *args, **kwargs)
        finally:
            if token is not None:
                rec = guarded("kv_cache_alloc", end_phase, name, token)
                if rec is not None and profiling:
                    added = rec.end.torch_allocated_bytes - rec.start.torch_allocated_bytes
                    st.graph_profile.kv_init_added_bytes = added
            st.profiling_kv = False

    return wrapper


def wrap_allocate_kv_cache(orig: Callable[..., Any]) -> Callable[..., Any]:
    """allocate_kv_cache: the size of the KV backing buffer (profiling or real)."""

    @functools.wraps(orig)
    def wrapper(kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(kv_cache_config, *args, **kwargs)
        st = state()
        if st.settings.enabled:
            guarded("allocate_kv_cache", _note_kv_buffer, kv_cache_config)
        return result

    return wrapper


def _note_kv_buffer(kv_cache_config: Any) -> None:
    st = state()
    sizes = {int(t.size) for t in getattr(kv_cache_config, "kv_cache_tensors", [])}
    total = sum(sizes)
    if st.profiling_kv:
        st.kv.profiling_kv_bytes += total
        return
    st.kv.kv_buffer_bytes += total
    st.kv.num_blocks = int(getattr(kv_cache_config, "num_blocks", 0))


def wrap_extrapolate(orig: Callable[..., Any]) -> Callable[..., Any]:
    """_extrapolate_full_graph_memory(mem_samples, total_graphs): keep vLLM's samples."""

    @functools.wraps(orig)
    def wrapper(mem_samples: list[int], total_graphs: int) -> Any:
        st = state()
        if st.settings.enabled:
            st.graph_profile.samples = [int(s) for s in mem_samples]
            st.graph_profile.full_graph_count = int(total_graphs)
            if st.settings.estimate == "apply":
                # Every FULL graph was captured: apply vLLM's own rule to its two usual
                # samples, so the figure it logs is the one it would have computed.
                return orig(list(mem_samples[:2]), total_graphs)
        return orig(mem_samples, total_graphs)

    return wrapper


# --------------------------------------------------------------------------- patch list
def _adaptor_patches() -> tuple[Patch, ...]:
    """compile / load of vLLM's Inductor adaptors: the FX graph behind each generated module."""
    from memest_instrumentation.vllm.inductor import wrap_adaptor

    return tuple(
        Patch("compiled_code", ADAPTORS, cls, attr, params, wrap_adaptor)
        for cls in ("InductorStandaloneAdaptor", "InductorAdaptor")
        for attr, params in (
            ("compile", ("self", "graph", "example_inputs")),
            ("load", ("self", "handle", "graph", "example_inputs")),
        )
    )


def _profile_run_patch(module: str, runner: str) -> Patch:
    """The profile_run phase, hooked the same way on either model runner's class."""
    return Patch(
        "profile_run",
        module,
        "GPUModelRunner",
        "profile_run",
        ("self", "randomize_inputs"),
        phase_wrapper(
            "profile_run",
            "profile_run",
            settle_end=True,
            before=_before_profile_run,
            after=_after_profile_run,
        ),
        runner=runner,
    )


#: vLLM 0.33.0's patches (the list every release's row starts from).
PATCHES: tuple[Patch, ...] = (
    Patch(
        "init_device",
        WORKER,
        "Worker",
        "init_device",
        ("self",),
        phase_wrapper("init_device", "init_device", after=_after_init_device),
    ),
    Patch(
        "weights", WORKER, "Worker", "load_model", ("self",), phase_wrapper("weights", "weights")
    ),
    Patch(
        "determine_available_memory",
        WORKER,
        "Worker",
        "determine_available_memory",
        ("self",),
        phase_wrapper(
            "determine_available_memory",
            "determine_available_memory",
            settle_end=True,
            before=_before_determine,
            after=_after_determine,
        ),
    ),
    Patch(
        "kv_config",
        WORKER,
        "Worker",
        "initialize_from_config",
        ("self", "kv_cache_config"),
        phase_wrapper("initialize_from_config", "kv_config", after=_after_init_from_config),
    ),
    Patch(
        "end_of_init",
        WORKER,
        "Worker",
        "compile_or_warm_up_model",
        ("self",),
        phase_wrapper("compile_or_warm_up_model", "end_of_init", after=_after_compile),
    ),
    _profile_run_patch(W2, "v2"),
    Patch(
        "graph_profiling",
        W2,
        "GPUModelRunner",
        "profile_cudagraph_memory",
        ("self",),
        phase_wrapper(
            "graph_profiling.total",
            "graph_profiling",
            settle_end=True,
            before=_before_graph_profiling,
            after=_after_graph_profiling,
        ),
        runner="v2",
    ),
    Patch(
        "kv_cache_alloc",
        W2,
        "GPUModelRunner",
        "initialize_kv_cache",
        ("self", "kv_cache_config", "is_profiling"),
        wrap_initialize_kv_cache,
        runner="v2",
    ),
    Patch(
        "capture",
        W2,
        "GPUModelRunner",
        "capture_model",
        ("self", "profile_only"),
        wrap_capture_model,
        runner="v2",
    ),
    Patch(
        "capture_stage",
        CG,
        "CudaGraphManager",
        "capture",
        ("self", "create_forward_fn", "progress_bar_desc"),
        wrap_cg_capture,
        runner="v2",
    ),
    Patch(
        "av_profiling",
        AV,
        "AdaptiveVerificationManager",
        "batches_to_profile",
        ("self", "capture_sizes"),
        wrap_av_batches,
        runner="v2",
    ),
    Patch(
        "graph_profiling_samples",
        CG,
        None,
        "_extrapolate_full_graph_memory",
        ("mem_samples", "total_graphs"),
        wrap_extrapolate,
        runner="v2",
    ),
    Patch(
        "allocate_kv_cache",
        ATTN,
        None,
        "allocate_kv_cache",
        ("kv_cache_config", "device"),
        wrap_allocate_kv_cache,
        runner="v2",
    ),
    # Model Runner V1 where it differs.
    _profile_run_patch(W1, "v1"),
    Patch(
        "graph_profiling",
        W1,
        "GPUModelRunner",
        "profile_cudagraph_memory",
        ("self",),
        phase_wrapper(
            "graph_profiling",
            "graph_profiling",
            settle_end=True,
            before=_before_graph_profiling,
            after=_after_graph_profiling,
        ),
        runner="v1",
    ),
    Patch(
        "kv_cache_alloc",
        W1,
        "GPUModelRunner",
        "initialize_kv_cache",
        ("self", "kv_cache_config", "is_profiling"),
        wrap_initialize_kv_cache,
        runner="v1",
    ),
    Patch(
        "capture",
        W1,
        "GPUModelRunner",
        "capture_model",
        ("self",),
        phase_wrapper("capture", "capture", before=_before_v1_capture),
        runner="v1",
    ),
    Patch(
        "capture_stage",
        W1,
        "GPUModelRunner",
        "_warmup_and_capture",
        ("self", "desc", "cudagraph_runtime_mode"),
        wrap_v1_warmup_and_capture,
        runner="v1",
    ),
    *_adaptor_patches(),
)

#: vLLM 0.34's growable KV cache (extensible.py). ``measure_kv_cache_blocks`` is patched where
#: gpu_worker imported it by name; ``measure_kv_cache_bytes`` where the former looks it up.
EXTENSIBLE_PATCHES: tuple[Patch, ...] = (
    Patch(
        "kv_cache_sizing",
        WORKER,
        None,
        "measure_kv_cache_blocks",
        ("kv_cache", "vllm_config", "device"),
        wrap_measure_kv_cache_blocks,
        runner="v2",
    ),
    Patch(
        "kv_cache_sizing",
        EXTENSIBLE,
        None,
        "measure_kv_cache_bytes",
        ("init_free_memory", "free_memory", "committed_bytes", "requested_memory"),
        wrap_measure_kv_cache_bytes,
        runner="v2",
    ),
    Patch(
        "kv_cache_extend",
        WORKER,
        "Worker",
        "extend_kv_cache",
        ("self", "num_blocks"),
        phase_wrapper("kv_cache_extend", "kv_cache_extend", after=after_extend),
        runner="v2",
    ),
)

#: The patches per supported release (memest.vllm_versions.VERSIONS): a new release is a row.
#: vLLM 0.34 has no Model Runner V1 and adds the growable KV cache.
PATCHES_BY_VERSION: dict[str, tuple[Patch, ...]] = {
    "0.33.0": PATCHES,
    "0.34.0": (*(p for p in PATCHES if p.runner != "v1"), *EXTENSIBLE_PATCHES),
}

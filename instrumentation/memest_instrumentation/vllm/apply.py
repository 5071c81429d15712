"""MEMEST_ESTIMATE=apply: size the KV cache from memest's full-initialization measurement.

vLLM's graph-memory profiling captures into a throwaway pool; in apply mode memest lifts its
2-sample limit on target FULL graphs so every stage is captured, then reads (all from the
allocator, after ``empty_cache``):

- what stays reserved in the throwaway pool (graph pool, by reservation, per stage);
- default-pool memory the capture keeps live (graph output buffers, workspaces) and memory
  outside PyTorch the captured graphs hold until the profiling teardown;
- runner buffers that ``initialize_kv_cache`` allocates beside the profiling KV cache;
- device memory in use now (weights, profiling residue, CUDA context, NCCL);
- the profile run's transient activation peak, which serving needs again, plus the
  prompt-logprobs chunk a serving step scores and the profile run does not
  (memest.estimate.sampler).

``Worker.determine_available_memory`` then returns requested memory minus those terms
(``memest.estimate.full_init_kv_budget``), so the KV cache is sized once, right.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from memest.estimate import full_init_kv_budget
from memest.estimate.mla_context import run_mla_context_bytes
from memest.estimate.profiling import ProfilingReadings, capture_details, profiling_terms
from memest.estimate.sampler import run_serving_step_bytes
from memest.schema import FullInitTerms, MemoryReading
from memest_instrumentation.vllm import dims, measure
from memest_instrumentation.vllm.state import guarded, state


def _mla_context_bytes(worker: Any) -> int:
    """memest.estimate.mla_context for this start (0 without MLA or when unreadable)."""
    st = state()
    vllm_config = getattr(worker, "vllm_config", None)
    guarded("mla_prefill", dims.record_mla_prefill, vllm_config)
    guarded("gdn_prefill", dims.record_gdn_prefill, vllm_config)
    cache = getattr(vllm_config, "cache_config", None)
    block_size = int(getattr(cache, "block_size", None) or 16)
    if st.config is None:
        return 0
    return guarded("mla_context", run_mla_context_bytes, st.config, block_size) or 0


def _serving_step_bytes() -> int:
    """memest.estimate.sampler's full-batch step beyond the profile pass for this start (the
    prompt-logprobs chunk, linear-attention prefill; 0 when unreadable): a serving step
    allocates it, the profile run whose headroom memest measured does not."""
    st = state()
    if st.config is None:
        return 0
    return guarded("serving_step", run_serving_step_bytes, st.config) or 0


def serving_transient_bytes(vllm_config: Any) -> int | None:
    """What serving's steps take beyond init, from this start's readings: the warm profile
    pass's activation headroom, the full-batch step's reserve and MLA's prefill over cached
    context (each as the term model counts it); None where the headroom was not measured."""
    headroom = state().figures.profile_headroom_bytes
    if headroom is None:
        return None
    context = _mla_context_bytes(SimpleNamespace(vllm_config=vllm_config))
    return int(headroom) + _serving_step_bytes() + context


def measured_terms(worker: Any, now: MemoryReading) -> FullInitTerms | None:
    """The full-initialization terms of this start, or None when graph profiling did not run."""
    st = state()
    gp = st.graph_profile
    start, end = gp.start, gp.end_settled
    requested = st.vllm.requested_memory_bytes
    if start is None or end is None or requested is None or now.device_used_bytes is None:
        return None
    if st.figures.profile_headroom_bytes is None:
        st.notes.append("apply: the profile run's activation peak was not measured")
        return None
    pool = gp.pool
    by_stage: dict[str, int] = {}
    for row in st.stages:
        if row.phase == "graph_profiling":
            by_stage[row.stage] = by_stage.get(row.stage, 0) + row.pool_growth_bytes
    readings = ProfilingReadings(
        start=start,
        end=end,
        now=now,
        pool_growth_bytes=measure.private_pool_bytes(end, pool)
        - measure.private_pool_bytes(start, pool),
        kv_init_added_bytes=gp.kv_init_added_bytes,
        profiling_kv_bytes=st.kv.profiling_kv_bytes,
        weights_bytes=st.vllm.weights_bytes or 0,
        activation_bytes=st.figures.profile_headroom_bytes,
        requested_bytes=int(requested),
        margin_bytes=st.settings.margin_bytes,
        stage_pool_bytes=by_stage,
        mla_context_bytes=_mla_context_bytes(worker),
        serving_step_bytes=_serving_step_bytes(),
    )
    st.apply_terms.details = capture_details(readings)
    return profiling_terms(
        readings,
        source="measured in this start (graph-memory profiling with every stage captured)",
    )


def applied_budget(worker: Any, vllm_result: Any) -> int | None:
    """The KV bytes determine_available_memory returns in apply mode (None keeps vLLM's)."""
    st = state()
    if st.plan.kv_cache_memory_bytes_given:
        st.notes.append("apply: kv_cache_memory_bytes was given, so vLLM did not profile")
        return None
    now = measure.reading()
    terms = measured_terms(worker, now)
    if terms is None:
        st.notes.append("apply: a full-initialization term is unmeasured; vLLM's budget kept")
        return None
    memest_kv = full_init_kv_budget(terms)
    vllm_available = int(getattr(worker, "available_kv_cache_memory_bytes", vllm_result))
    reserved_elsewhere = vllm_available - int(vllm_result)  # multimodal IPC reservation
    st.apply_terms.terms = terms
    st.apply_terms.memest_kv_bytes = memest_kv
    st.apply_terms.vllm_kv_bytes = vllm_available
    worker.available_kv_cache_memory_bytes = memest_kv
    return max(memest_kv - max(reserved_elsewhere, 0), 0)

"""vLLM 0.34's growable KV cache: its sizing recorded, memest's margin applied, the report after.

vLLM 0.34 (``vllm/v1/worker/extensible_kv_cache.py``, on by default on CUDA) reserves the KV
cache's address space, runs warm-up and capture beside a few committed blocks, then commits
blocks from the memory measured after capture (``measure_kv_cache_blocks``, which calls
``measure_kv_cache_bytes``), keeping free the measured transient peak plus a margin of
``max(1 GiB, 0.75 x peak)``. The engine then has every worker ``Worker.extend_kv_cache`` to
the minimum block count over ranks. memest's hooks:

- ``measure_kv_cache_blocks`` (patched where ``gpu_worker`` imported it): the cache's figures
  before and after the sizing (``report.vllm.extensible_kv``);
- ``measure_kv_cache_bytes``: the readings it sized from. With ``MEMEST_ESTIMATE=apply`` memest
  passes its own terms through the function's own parameters: ``transient_peak_bytes`` the
  larger of vLLM's measured peak and what serving's steps take by memest's terms (the warm
  profile pass's activation headroom, the prompt-logprobs chunk, MLA's prefill over context),
  ``margin_floor_bytes`` vLLM's non-torch reserve plus ``MEMEST_MARGIN_BYTES``
  (``ExtensibleKV.memest_margin_bytes``) and ``margin_fraction`` 0, so the margin is memest's
  instead of vLLM's guess. (``kv_cache_memory_bytes`` would turn the
  growable cache off; ``gpu_memory_utilization`` only caps the budget, and
  ``reserved_headroom_bytes`` scales vLLM's margin with it.)
- ``Worker.extend_kv_cache``: phase ``kv_cache_extend``; the report is written after it, since
  the committed size is known only then (``compile_or_warm_up_model`` returns before).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from memest.schema import ExtensibleKvSizing
from memest.units import fmt_gib
from memest.vllm_versions import ExtensibleKV, resolve_version
from memest_instrumentation.vllm.state import guarded, state


def growable(worker: Any) -> bool:
    """Whether this worker's KV cache is vLLM 0.34's growable one (sized after capture)."""
    cache = getattr(worker, "cache_config", None)
    return bool(getattr(cache, "enable_extensible_kv_cache", False))


def _constants() -> ExtensibleKV:
    kv = resolve_version("0.34.0").extensible_kv
    assert kv is not None
    return kv


def memest_transient_bytes(vllm_transient_bytes: int) -> tuple[int, int] | None:
    """(the transient peak memest has vLLM keep free, memest's own figure): the larger of
    vLLM's own measurement and what memest measured serving's steps take
    (apply.serving_transient_bytes: the warm profile pass's headroom, the full-batch step's
    reserve, MLA's prefill over cached context); None where memest did not measure the
    headroom. vLLM's profiled allocated peak can exceed serving's steps; it stays the floor, as
    torch's allocator is capped by what the sizing keeps free."""
    from memest_instrumentation.vllm.apply import serving_transient_bytes

    ours = serving_transient_bytes(_current_vllm_config())
    if ours is None:
        return None
    return max(int(vllm_transient_bytes), int(ours)), int(ours)


def _current_vllm_config() -> Any:
    """The engine's configuration while vLLM sizes its cache (None where unreadable)."""
    try:
        from vllm.config import get_current_vllm_config

        return get_current_vllm_config()
    except Exception:
        return None


def wrap_measure_kv_cache_bytes(orig: Callable[..., Any]) -> Callable[..., Any]:
    """measure_kv_cache_bytes(**readings): recorded; memest's terms in apply mode."""

    @functools.wraps(orig)
    def wrapper(**kwargs: Any) -> Any:
        st = state()
        if not st.settings.enabled:
            return orig(**kwargs)
        vllm_bytes = orig(**kwargs)
        first = st.extensible_sizing.readings is None
        if first:
            st.extensible_sizing.readings = {**kwargs, "vllm_kv_bytes": int(vllm_bytes)}
        if st.settings.estimate != "apply":
            return vllm_bytes
        terms = guarded("kv_cache_sizing", _memest_terms, kwargs)
        if terms is None:
            return vllm_bytes
        memest_bytes = orig(**{**kwargs, **terms})
        if first:
            st.extensible_sizing.memest_terms = {**terms, "memest_kv_bytes": int(memest_bytes)}
        return memest_bytes

    return wrapper


def _memest_terms(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The measure_kv_cache_bytes arguments memest replaces in apply mode, or None (vLLM's own
    sizing stands) when memest has not measured its transient: its margin of
    MEMEST_MARGIN_BYTES is safe only beside a measured transient, and torch's reservation is
    capped by what the sizing keeps free, so a short transient fails serving's first step."""
    transients = memest_transient_bytes(kwargs.get("transient_peak_bytes", 0))
    if transients is None:
        state().notes.append(
            "growable KV cache: memest's activation headroom was not measured; "
            "vLLM's own sizing kept"
        )
        return None
    state().extensible_sizing.measured_transient_bytes = transients[1]
    return {
        "transient_peak_bytes": transients[0],
        "margin_floor_bytes": _constants().memest_margin_bytes(state().settings.margin_bytes),
        "margin_fraction": 0.0,
    }


def wrap_measure_kv_cache_blocks(orig: Callable[..., Any]) -> Callable[..., Any]:
    """measure_kv_cache_blocks(kv_cache, vllm_config, device, ...): the cache around the sizing."""

    @functools.wraps(orig)
    def wrapper(kv_cache: Any, *args: Any, **kwargs: Any) -> Any:
        st = state()
        if not st.settings.enabled:
            return orig(kv_cache, *args, **kwargs)
        st.extensible_sizing.readings = None
        st.extensible_sizing.memest_terms = None
        blocks = orig(kv_cache, *args, **kwargs)
        guarded("kv_cache_sizing", _record_sizing, kv_cache, int(blocks))
        return blocks

    return wrapper


def _record_sizing(kv_cache: Any, blocks: int) -> None:
    """report.vllm.extensible_kv from the sizing's readings and the cache's own figures."""
    st = state()
    readings = st.extensible_sizing.readings
    if readings is None:
        st.notes.append("growable KV cache: measure_kv_cache_bytes was not seen; not recorded")
        return
    kv = _constants()
    transient = int(readings.get("transient_peak_bytes", 0))
    ours = st.extensible_sizing.memest_terms
    headroom = int(readings["free_memory"]) + int(readings["committed_bytes"])
    st.vllm.extensible_kv = ExtensibleKvSizing(
        capacity_blocks=int(kv_cache.capacity_blocks),
        bytes_per_block=int(kv_cache.bytes_per_block),
        init_free_bytes=int(readings["init_free_memory"]),
        free_after_warmup_bytes=int(readings["free_memory"]),
        committed_at_sizing_bytes=int(readings["committed_bytes"]),
        requested_bytes=int(readings["requested_memory"]),
        transient_peak_bytes=transient,
        torch_reserve_growth_bytes=int(readings.get("torch_reserve_growth_bytes", 0)),
        warmup_reserve_bytes=kv.warmup_reserve_bytes(transient, headroom),
        margin_bytes=kv.margin_bytes(transient),
        non_torch_reserve_bytes=kv.non_torch_reserve_bytes,
        vllm_kv_bytes=int(readings["vllm_kv_bytes"]),
        memest_transient_peak_bytes=None if ours is None else ours["transient_peak_bytes"],
        memest_measured_transient_bytes=None
        if ours is None
        else st.extensible_sizing.measured_transient_bytes,
        memest_margin_bytes=None if ours is None else ours["margin_floor_bytes"],
        memest_kv_bytes=None if ours is None else ours["memest_kv_bytes"],
        torch_memory_limit_bytes=getattr(kv_cache, "torch_memory_limit", None),
        sized_by="vllm" if ours is None else "memest",
    )
    st.notes.append(_sizing_note(st.vllm.extensible_kv, blocks))


def _sizing_note(sizing: ExtensibleKvSizing, blocks: int) -> str:
    """One line for every surface that shows a report's notes."""
    line = (
        f"vLLM's growable KV cache: {fmt_gib(sizing.vllm_kv_bytes)} GiB by vLLM's sizing, "
        f"keeping its {fmt_gib(sizing.transient_peak_bytes)} GiB measured transient peak and a "
        f"{fmt_gib(sizing.margin_bytes)} GiB margin free"
    )
    if sizing.memest_kv_bytes is None:
        return f"{line}; {blocks} blocks on this rank"
    return (
        f"{line}; memest's sizing {fmt_gib(sizing.memest_kv_bytes)} GiB (transient "
        f"{fmt_gib(sizing.memest_transient_peak_bytes or 0)} GiB, margin "
        f"{fmt_gib(sizing.memest_margin_bytes or 0)} GiB); {blocks} blocks on this rank"
    )


def after_extend(worker: Any, args: Any, kwargs: Any, result: Any, record: Any) -> None:
    """Worker.extend_kv_cache: the committed size, then the end of init (the report)."""
    from memest_instrumentation.vllm import finish

    guarded("kv_cache_extend", _record_committed, worker)
    finish.end_of_init(worker)


def _record_committed(worker: Any) -> None:
    st = state()
    kv_cache = getattr(getattr(worker, "model_runner", None), "extensible_kv_cache", None)
    sizing = st.vllm.extensible_kv
    if kv_cache is None or sizing is None:
        return
    sizing.committed_blocks = int(kv_cache.num_committed_blocks)
    sizing.committed_bytes = int(kv_cache.physical_bytes)
    st.vllm.num_gpu_blocks = sizing.committed_blocks
    if sizing.torch_memory_limit_bytes is None:
        sizing.torch_memory_limit_bytes = getattr(kv_cache, "torch_memory_limit", None)

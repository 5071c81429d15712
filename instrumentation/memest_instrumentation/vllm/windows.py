"""Phase and stage windows: readings at the edges of each startup phase and capture stage."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from memest.schema import PhaseRecord, StageGrowth
from memest.snapshot.tags import DEFAULT_POOL
from memest_instrumentation.vllm import measure
from memest_instrumentation.vllm.state import StageWindow, guarded, state


# --------------------------------------------------------------------------- phases
def begin_phase(name: str) -> tuple[str, Any]:
    st = state()
    previous = st.current_phase
    st.current_phase = name
    rec = st.recorder
    ctx = None
    if rec is not None:
        ctx = rec.phase(name)
        ctx.__enter__()
    return previous, (ctx, measure.reading())


def end_phase(name: str, token: tuple[str, Any], *, settle: bool = False) -> PhaseRecord:
    st = state()
    previous, (ctx, start) = token
    close_stage()
    if settle:
        measure.settle()
    end = measure.reading()
    record = PhaseRecord(name=name, start=start, end=end)
    st.phases.append(record)
    st.current_phase = previous
    if ctx is not None:
        ctx.__exit__(None, None, None)
    return record


def phase_wrapper(
    name: str,
    hook: str,
    *,
    settle_end: bool = False,
    before: Callable[..., None] | None = None,
    after: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a method in a named phase with readings at both edges.

    ``after(self, args, kwargs, result, record)`` may return a replacement for the result
    (apply mode); ``None`` keeps vLLM's value.
    """

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            st = state()
            if not st.settings.enabled:
                return orig(self, *args, **kwargs)
            if before is not None:
                guarded(f"{hook}.before", before, self, args, kwargs)
            token = guarded(hook, begin_phase, name)
            result = orig(self, *args, **kwargs)
            record = None
            if token is not None:
                record = guarded(hook, end_phase, name, token, settle=settle_end)
            if after is not None:
                replaced = guarded(f"{hook}.after", after, self, args, kwargs, result, record)
                if replaced is not None:
                    return replaced
            return result

        return wrapper

    return make


# --------------------------------------------------------------------------- stages
def close_stage() -> None:
    st = state()
    window = st.open_stage
    if window is None:
        return
    st.open_stage = None
    end = measure.reading()
    growth = measure.private_pool_bytes(end, window.pool) - measure.private_pool_bytes(
        window.start, window.pool
    )
    default = end.pool_reserved_bytes.get(DEFAULT_POOL, 0) - window.start.pool_reserved_bytes.get(
        DEFAULT_POOL, 0
    )
    st.stages.append(
        StageGrowth(
            stage=window.stage,
            phase=window.phase,
            pool_growth_bytes=max(growth, 0),
            pool_released_bytes=max(-growth, 0),
            default_pool_growth_bytes=max(default, 0),
            graph_count=len(window.sizes),
            capture_sizes=sorted(set(window.sizes), reverse=True),
            widest=str(max(window.sizes)) + " tokens" if window.sizes else None,
            pools=[window.pool] if window.pool and growth > 0 else [],
        )
    )
    if st.recorder is not None and getattr(st, "_stage_ctx", None) is not None:
        ctx = st._stage_ctx  # type: ignore[attr-defined]
        st._stage_ctx = None  # type: ignore[attr-defined]
        ctx.__exit__(None, None, None)


def enter_stage(stage: str, pool: str | None, size: int | None) -> None:
    """Mark the capture stage now running; a new stage closes the previous one."""
    st = state()
    phase = "graph_profiling" if st.current_phase == "graph_profiling" else "capture"
    window = st.open_stage
    if window is None or window.stage != stage or window.phase != phase or window.pool != pool:
        close_stage()
        window = StageWindow(phase=phase, stage=stage, pool=pool, start=measure.reading())
        st.open_stage = window
        if st.recorder is not None:
            ctx = st.recorder.stage(stage)
            ctx.__enter__()
            st._stage_ctx = ctx  # type: ignore[attr-defined]
    if size is not None:
        window.sizes.append(int(size))

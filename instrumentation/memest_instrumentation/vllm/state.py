"""Per-process state of one instrumented vLLM start, and the fail-open guard every hook uses."""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from memest_instrumentation.vllm.env import Settings, derive_run_id

if TYPE_CHECKING:  # the schema is imported by the first hook that runs, not by register()
    from memest.schema import (
        CompiledCode,
        CompiledNode,
        FullInitTerms,
        KVCacheSpec,
        MemoryReading,
        PhaseRecord,
        RunConfig,
        StageGrowth,
        VllmFigures,
    )

logger = logging.getLogger("memest.vllm")

T = TypeVar("T")


class InjectedFault(RuntimeError):
    """Raised by a hook named in MEMEST_FAULT (fault-injection testing)."""


@dataclass
class StageWindow:
    """The open capture stage: where pool readings started."""

    phase: str
    stage: str
    pool: str | None
    start: MemoryReading
    sizes: list[int] = field(default_factory=list)


@dataclass
class GraphProfiling:
    """vLLM's graph-memory profiling pass, as memest read it."""

    lift_full_limit: bool = False  # apply mode: capture every FULL graph, not two samples
    start: MemoryReading | None = None
    end_settled: MemoryReading | None = None  # after empty_cache, the throwaway pool held
    pool: str | None = None
    measured_bytes: int | None = None  # what vLLM's profile_cudagraph_memory returned
    samples: list[int] = field(default_factory=list)  # vLLM's FULL-graph samples
    full_graph_count: int = 0
    kv_init_added_bytes: int = 0  # allocated by the profiling pass's initialize_kv_cache


@dataclass
class KVState:
    """The KV cache: vLLM's spec (without the block count) and the buffers allocated."""

    spec: KVCacheSpec | None = None
    num_blocks: int | None = None
    profiling_kv_bytes: int = 0
    kv_buffer_bytes: int = 0


@dataclass
class Measured:
    """memest's own figures of this start, beside vLLM's (RunState.vllm)."""

    init_free_bytes: int | None = None  # vLLM's init snapshot: the startup plan's baseline
    profile_headroom_bytes: int | None = None  # activation headroom; None: not measured
    profile_headroom_source: str = ""  # "memest" (its profile_run hook) or "vllm"
    profile_run_compiled: int = 0  # compilations during vLLM's profile run
    compiles_before_profile_run: int | None = None
    capture_pool: str | None = None  # the real capture's graph pool


@dataclass
class ApplyOutcome:
    """MEMEST_ESTIMATE=apply: the terms measured and the KV budgets memest and vLLM gave."""

    terms: FullInitTerms | None = None
    memest_kv_bytes: int | None = None
    vllm_kv_bytes: int | None = None
    details: dict[str, int] = field(default_factory=dict)  # capture readings behind the terms

    def components(self) -> dict[str, int]:
        """What the report keeps beside the terms (EstimateComparison.components)."""
        budgets = {"memest_kv_bytes": self.memest_kv_bytes, "vllm_kv_bytes": self.vllm_kv_bytes}
        return {**self.details, **{k: v for k, v in budgets.items() if v is not None}}


@dataclass
class PlanState:
    """vLLM's startup-plan fingerprint for this start, and the plan memest wrote."""

    fingerprint: str | None = None
    kv_cache_memory_bytes_given: int | None = None  # set: this start was sized by a plan
    kv_cache_memory_bytes: int | None = None
    path: str | None = None
    split_scope: Any = None  # vLLM's split-limit scope around a bare profile run (plan_path.py)


@dataclass
class ExtensibleSizing:
    """vLLM 0.34's growable-cache sizing as its measure_kv_cache_bytes call saw it."""

    readings: dict[str, Any] | None = None  # its arguments, and the bytes vLLM's own terms gave
    memest_terms: dict[str, Any] | None = None  # apply: the arguments memest passed instead
    measured_transient_bytes: int | None = None  # apply: memest's own transient, before the max


def _vllm_figures() -> VllmFigures:
    from memest.schema import VllmFigures

    return VllmFigures()


@dataclass
class RunState:
    """Everything one worker process measured during its start."""

    settings: Settings
    run_id: str = ""
    rank: int = 0
    world_size: int = 1
    phases: list[PhaseRecord] = field(default_factory=list)
    stages: list[StageGrowth] = field(default_factory=list)
    open_stage: StageWindow | None = None
    current_phase: str = ""
    hook_errors: list[str] = field(default_factory=list)
    error_counts: dict[str, int] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    vllm: VllmFigures = field(default_factory=_vllm_figures)
    figures: Measured = field(default_factory=Measured)
    config: RunConfig | None = None
    kv: KVState = field(default_factory=KVState)
    graph_profile: GraphProfiling = field(default_factory=GraphProfiling)
    apply_terms: ApplyOutcome = field(default_factory=ApplyOutcome)
    plan: PlanState = field(default_factory=PlanState)
    extensible_sizing: ExtensibleSizing = field(default_factory=ExtensibleSizing)
    capture_pool: str | None = None
    profiling_kv: bool = False
    finalized: bool = False
    recorder: Any = None
    history_tried: bool = False
    code_nodes: dict[str, dict[str, CompiledNode]] = field(default_factory=dict)
    compiled_code: CompiledCode | None = None
    work_s: dict[str, float] = field(default_factory=dict)
    shed_reason: str = ""

    def charge(self, hook: str, seconds: float) -> None:
        """Count memest's own time in a hook; past the budget, shed optional work once."""
        self.work_s[hook] = self.work_s.get(hook, 0.0) + seconds
        if not self.shed_reason and self.work_seconds() > self.settings.work_budget_s:
            self.shed(
                f"memest's own work reached {self.work_seconds():.1f} s (budget "
                f"MEMEST_WORK_BUDGET_S={self.settings.work_budget_s:g}; slowest hook "
                f"{max(self.work_s, key=self.work_s.__getitem__)})"
            )

    def work_seconds(self) -> float:
        return sum(self.work_s.values())

    def shed(self, reason: str) -> None:
        """Stop optional work for the rest of the start: history, warm pass, analysis."""
        self.shed_reason = reason
        self.notes.append(f"optional work shed: {reason}")
        logger.warning("memest: %s; optional work (history, analysis) shed for this start", reason)
        rec, self.recorder = self.recorder, None
        if rec is not None:
            try:
                rec.stop()
            except Exception as exc:  # fail open
                self.fail("shed", exc)

    @property
    def shedding(self) -> bool:
        return bool(self.shed_reason)

    def fail(self, hook: str, exc: BaseException) -> None:
        """Record a hook failure; log a warning once per hook name.

        ``hook_errors`` keeps each distinct message once; ``error_counts`` counts repeats.
        """
        msg = f"{hook}: {type(exc).__name__}: {exc}"
        if msg not in self.error_counts:
            self.hook_errors.append(msg)
        self.error_counts[msg] = self.error_counts.get(msg, 0) + 1
        if hook not in self.warned:
            self.warned.add(hook)
            logger.warning(
                "memest hook %s failed; vLLM continues without it (%s)\n%s",
                hook,
                msg,
                "".join(traceback.format_exception_only(type(exc), exc)).strip(),
            )


_STATE: RunState | None = None


def state() -> RunState:
    """This process's state (created on first use from the environment)."""
    global _STATE
    if _STATE is None:
        _STATE = RunState(settings=Settings.from_env())
        if _STATE.settings.enabled:
            _STATE.run_id = derive_run_id()
        # Each problem is one warning naming its variable (fail() would log only the first),
        # and recorded in the report's hook errors.
        _STATE.warned.add("settings")
        for problem in _STATE.settings.problems:
            logger.warning("memest setting ignored: %s", problem)
            _STATE.fail("settings", ValueError(problem))
    return _STATE


def reset_state(settings: Settings | None = None) -> RunState:
    """Start over (tests, or a second engine in one process)."""
    global _STATE
    _STATE = RunState(settings=settings or Settings.from_env())
    return _STATE


def maybe_fault(hook: str) -> None:
    """Raise when MEMEST_FAULT names this hook (or 'all')."""
    faults = state().settings.faults
    if faults and ("all" in faults or hook in faults):
        raise InjectedFault(f"injected fault in {hook}")


class Watchdog:
    """Logs, once per call, a memest hook that runs longer than MEMEST_SLOW_HOOK_S.

    Python cannot interrupt a call in progress, so the watchdog makes a slow hook visible (its
    stack while it runs) and the work budget (RunState.charge) bounds what follows it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: tuple[str, float, int] | None = None
        self._reported: tuple[str, float, int] | None = None
        self._thread: threading.Thread | None = None

    def begin(self, hook: str) -> None:
        with self._lock:
            self._current = (hook, time.monotonic(), threading.get_ident())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="memest-watchdog", daemon=True
                )
                self._thread.start()

    def end(self) -> None:
        with self._lock:
            self._current = None

    def _run(self) -> None:
        while True:
            limit_s = state().settings.slow_hook_s
            time.sleep(min(1.0, limit_s / 4))
            with self._lock:
                current = self._current
            if current is None or current is self._reported:
                continue
            hook, since, ident = current
            elapsed = time.monotonic() - since
            if elapsed < limit_s:
                continue
            self._reported = current
            frame = sys._current_frames().get(ident)
            stack = "".join(traceback.format_stack(frame, limit=12)) if frame else ""
            logger.warning("memest hook %s has run %.0f s so far:\n%s", hook, elapsed, stack)
            state().notes.append(f"slow hook: {hook} ran over {limit_s:g} s")


_WATCHDOG = Watchdog()
_DEPTH = threading.local()


def guarded(hook: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run one piece of memest code inside a hook; any failure is recorded, never raised.

    The outermost guarded call is timed: its seconds count against the work budget, and the
    watchdog reports it while it runs past MEMEST_SLOW_HOOK_S.
    """
    st = state()
    depth = getattr(_DEPTH, "n", 0)
    outer = depth == 0
    _DEPTH.n = depth + 1
    started = time.monotonic()
    if outer:
        _WATCHDOG.begin(hook)
    try:
        maybe_fault(hook)
        return fn(*args, **kwargs)
    except Exception as exc:
        st.fail(hook, exc)
        return None
    finally:
        _DEPTH.n = depth
        if outer:
            _WATCHDOG.end()
            st.charge(hook, time.monotonic() - started)

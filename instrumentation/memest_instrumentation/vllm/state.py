"""Per-process state of one instrumented vLLM start, and the fail-open guard every hook uses."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memest.schema import MemoryReading, PhaseRecord, StageGrowth
from memest_instrumentation.vllm.env import Settings

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
    figures: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    kv: dict[str, Any] = field(default_factory=dict)
    graph_profile: dict[str, Any] = field(default_factory=dict)
    apply_terms: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    capture_pool: str | None = None
    profiling_kv: bool = False
    finalized: bool = False
    recorder: Any = None
    history_tried: bool = False

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
        for problem in _STATE.settings.problems:
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


def guarded(hook: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run one piece of memest code inside a hook; any failure is recorded, never raised."""
    st = state()
    try:
        maybe_fault(hook)
        return fn(*args, **kwargs)
    except Exception as exc:
        st.fail(hook, exc)
        return None

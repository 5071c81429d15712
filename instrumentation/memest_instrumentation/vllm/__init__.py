"""memest's vLLM general plugin: per-rank startup memory reports from inside ``vllm serve``.

Installed with memest, vLLM finds it through the entry point group ``vllm.general_plugins``
(``memest = memest_instrumentation.vllm:register``) and calls ``register()`` in every process,
sometimes twice. Set ``MEMEST_ENABLE=1`` to turn it on; every setting is a MEMEST_* variable
(``memest_instrumentation.vllm.env.help_text()``).
"""

from __future__ import annotations

import logging

from memest_instrumentation.vllm.env import ENV_VARS, Settings, help_text
from memest_instrumentation.vllm.patches import Patch, apply_patch, is_patched, remove_patch
from memest_instrumentation.vllm.state import reset_state, state

logger = logging.getLogger("memest.vllm")

__all__ = [
    "ENV_VARS",
    "Settings",
    "help_text",
    "instrument",
    "patches",
    "register",
    "uninstrument",
]


def patches() -> tuple[Patch, ...]:
    """Every patch memest installs on vLLM 0.33.0 (Worker, Model Runner V2 and V1)."""
    from memest_instrumentation.vllm.hooks import PATCHES

    return PATCHES


def instrument() -> list[str]:
    """Install every patch whose target exists with the expected signature (idempotent).

    Returns:
        One line per patch that could not be installed (vLLM changed); empty when all went in.
    """
    problems: list[str] = []
    for patch in patches():
        problem = apply_patch(patch)
        if problem is not None:
            problems.append(f"{patch.name}: {problem}")
    return problems


def uninstrument() -> None:
    """Remove every memest patch, restoring vLLM's originals (idempotent)."""
    for patch in reversed(patches()):
        remove_patch(patch)


def instrumented() -> bool:
    return any(is_patched(p) for p in patches())


def register() -> None:
    """vLLM general-plugin entry point: instrument when MEMEST_ENABLE=1. Never raises."""
    try:
        st = state()
        if not st.settings.enabled:
            return
        if not st.run_id:
            from memest_instrumentation.vllm.env import derive_run_id

            st.run_id = derive_run_id()
        for problem in instrument():
            st.fail("register", RuntimeError(problem))
    except Exception as exc:  # fail open: vLLM does not guard plugin functions
        try:
            state().fail("register", exc)
        except Exception:
            logger.warning("memest plugin disabled: %s", exc)


_ = reset_state  # re-exported for tests through memest_instrumentation.vllm.state

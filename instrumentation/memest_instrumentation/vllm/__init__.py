"""memest's vLLM general plugin: per-rank startup memory reports from inside ``vllm serve``.

Installed with memest, vLLM finds it through the entry point group ``vllm.general_plugins``
(``memest = memest_instrumentation.vllm:register``) and calls ``register()`` in every process,
sometimes twice. Set ``MEMEST_ENABLE=1`` to turn it on; every setting is a MEMEST_* variable
(``memest_instrumentation.vllm.env.help_text()``).

Loading the plugin is near-free: vLLM loads general plugins in processes that never start a
worker (the API server, ``LLM()``'s own process, the model-inspection subprocess), so importing
this package pulls in only the settings and the patch machinery, and ``register()`` installs
each patch when vLLM imports the module it patches. The patch list, the report schema and the
analysis are imported there, in the processes that start a worker.
"""

from __future__ import annotations

import logging
import sys

from memest_instrumentation.vllm.env import ENV_VARS, Settings, help_text
from memest_instrumentation.vllm.patches import (
    ImportWatch,
    Patch,
    apply_patch,
    remove_patch,
)
from memest_instrumentation.vllm.targets import MODULES_BY_VERSION

logger = logging.getLogger("memest.vllm")

__all__ = [
    "ENV_VARS",
    "Settings",
    "help_text",
    "instrument",
    "instrument_on_import",
    "modules",
    "patches",
    "register",
    "uninstrument",
    "vllm_release",
]


def vllm_release() -> str | None:
    """The installed vLLM release when memest supports it (``targets.MODULES_BY_VERSION``);
    None otherwise, after one warning naming it. Read from package metadata: no vLLM import.
    Without vLLM installed, the newest supported release (the patch list of tests)."""
    from memest.vllm_versions import NEWEST, installed_vllm_version

    version = installed_vllm_version()
    if version is None:
        return NEWEST.version
    if version in MODULES_BY_VERSION:
        return version
    if version not in _WARNED:
        _WARNED.add(version)
        logger.warning(
            "memest: vLLM %s is not supported (supported: %s); the plugin installs nothing",
            version,
            ", ".join(MODULES_BY_VERSION),
        )
    return None


_WARNED: set[str] = set()


def patches() -> tuple[Patch, ...]:
    """Every patch memest installs on the installed vLLM (none on an unsupported release)."""
    from memest_instrumentation.vllm.hooks import PATCHES_BY_VERSION

    release = vllm_release()
    return () if release is None else PATCHES_BY_VERSION[release]


def modules() -> tuple[str, ...]:
    """The vLLM modules memest patches on the installed release (none when unsupported)."""
    release = vllm_release()
    return () if release is None else MODULES_BY_VERSION[release]


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


def _patch_module(module: str) -> list[str]:
    """Install the patches whose target lives in ``module`` (already imported)."""
    problems: list[str] = []
    for patch in patches():
        if patch.module == module:
            problem = apply_patch(patch)
            if problem is not None:
                problems.append(f"{patch.name}: {problem}")
    return problems


def _on_import(module: str) -> None:
    """The import watch's call: runs inside vLLM's import, so it never raises."""
    try:
        for problem in _patch_module(module):
            _fail("register", RuntimeError(problem))
    except Exception as exc:
        _fail("register", exc)


_WATCH = ImportWatch(_on_import)


def instrument_on_import() -> list[str]:
    """Patch the modules vLLM has imported now, and each other one as soon as it is imported.

    Returns:
        The problems of the patches installed now (the others are recorded as they go in).
    """
    targets = modules()
    loaded = [m for m in targets if m in sys.modules]
    _WATCH.start({m for m in targets if m not in loaded})
    return [problem for module in loaded for problem in _patch_module(module)]


def uninstrument() -> None:
    """Remove every memest patch, restoring vLLM's originals (idempotent)."""
    _WATCH.stop()
    for patch in reversed(patches()):
        remove_patch(patch)


def register() -> None:
    """vLLM general-plugin entry point: instrument when MEMEST_ENABLE=1. Never raises.

    Patches go in when vLLM imports their modules (``instrument_on_import``); the per-process
    state, and the run id, are made by the first hook that runs.
    """
    try:
        if not Settings.from_env().enabled:
            return
        for problem in instrument_on_import():
            _fail("register", RuntimeError(problem))
    except Exception as exc:  # fail open: vLLM does not guard plugin functions
        _fail("register", exc)


def _fail(hook: str, exc: BaseException) -> None:
    try:
        from memest_instrumentation.vllm.state import state

        state().fail(hook, exc)
    except Exception:
        logger.warning("memest plugin disabled: %s", exc)

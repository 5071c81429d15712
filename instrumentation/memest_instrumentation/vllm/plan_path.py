"""vLLM's profile run on its ``kv_cache_memory_bytes`` path, held to its profiling path's rules.

vLLM 0.33.0's ``Worker.determine_available_memory`` runs ``profile_run`` inside
``_scoped_allocator_max_split(max_split_size_mb=20)`` and ``memory_profiling`` (whose exit empties
the allocator cache), except when ``kv_cache_memory_bytes`` is set: a startup plan applied or
``--kv-cache-memory-bytes`` given. Then the profile run runs bare. vLLM's own comment there says
what follows: workspaces that grow during the pass (MoE, MLA) are carved out of freed multi-GiB
blocks and pin those segments past the later ``empty_cache``. On the H200 a plan start of a
DeepSeek-V3-shaped model kept 1.59 GiB more of such free-but-reserved memory than the start that
wrote its plan (reports/vllm, call 31), and ended that much over budget.

A plan, or a pre-flight's ``--kv-cache-memory-bytes``, is sized from what the profiling path
retains; with the plugin on, the bare profile run gets that path's two rules back (vLLM's own
context manager, then a collection and ``empty_cache``). ``MEMEST_PLAN_PATH_SPLIT=0`` leaves the
path as vLLM runs it.
"""

from __future__ import annotations

import gc
from typing import Any

from memest_instrumentation.vllm import measure
from memest_instrumentation.vllm.state import state

#: vLLM's split limit for its profiling path (gpu_worker.py: max_split_size_mb=20).
MAX_SPLIT_SIZE_MB = 20


def on_plan_path(runner: Any) -> bool:
    """Whether this profile run is the bare one of the kv_cache_memory_bytes path."""
    cache_config = getattr(runner, "cache_config", None)
    return bool(getattr(cache_config, "kv_cache_memory_bytes", None))


def enter(runner: Any) -> Any:
    """Enter vLLM's split-limit scope for a bare profile run; the scope to leave, else None."""
    st = state()
    if not st.settings.plan_path_split or not on_plan_path(runner):
        return None
    from vllm.v1.worker.gpu_worker import Worker

    # The scope reads no worker state: vLLM's own allocator-settings swap, restored on exit.
    scope = Worker._scoped_allocator_max_split(None, MAX_SPLIT_SIZE_MB)  # type: ignore[arg-type]
    scope.__enter__()
    return scope


def leave(scope: Any) -> None:
    """Close the scope, then collect and empty the cache as memory_profiling's exit does."""
    try:
        scope.__exit__(None, None, None)
    finally:
        gc.collect()
        if measure.cuda_ready():
            measure._torch().cuda.empty_cache()

"""A profile run on vLLM 0.33.0's kv_cache_memory_bytes path gets its profiling path's rules back.

vLLM's ``Worker.determine_available_memory`` runs ``profile_run`` under
``_scoped_allocator_max_split(max_split_size_mb=20)`` and ``memory_profiling`` only when no
``kv_cache_memory_bytes`` is set; a plan start runs it bare. The plugin enters vLLM's own scope
around that bare run and empties the cache after it.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.instrumentation_vllm.conftest import vllm_or_skip


@pytest.mark.vllm
def test_vllm_runs_the_plan_paths_profile_run_outside_its_split_limit() -> None:
    vllm_or_skip()
    from vllm.v1.worker.gpu_worker import Worker

    source = inspect.getsource(Worker.determine_available_memory)
    plan_branch = source.index(
        "if kv_cache_memory_bytes := self.cache_config.kv_cache_memory_bytes"
    )
    bare_run = source.index("self.model_runner.profile_run(", plan_branch)
    returns = source.index("return reserve_mm_ipc_gpu_memory(", bare_run)
    scoped = source.index("self._scoped_allocator_max_split(max_split_size_mb=20)")
    assert plan_branch < bare_run < returns < scoped  # the bare run returns before the scope
    params = list(inspect.signature(Worker._scoped_allocator_max_split).parameters)
    assert params == ["self", "max_split_size_mb"]


def _recording_scope(calls: list[str]) -> Any:
    @contextlib.contextmanager
    def scope(self: Any, max_split_size_mb: int) -> Iterator[None]:
        calls.append(f"enter {max_split_size_mb} MiB")
        yield
        calls.append("exit")

    return scope


def _runner(kv_cache_memory_bytes: int | None) -> Any:
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(kv_cache_memory_bytes=kv_cache_memory_bytes)
    )


def _profile_run(
    monkeypatch: pytest.MonkeyPatch, runner: Any, env: dict[str, str] | None = None
) -> list[str]:
    """vLLM's profile run through the plugin's hooks (before, the run, after); what happened."""
    vllm_or_skip()
    from memest_instrumentation.vllm import hooks, measure, plan_path
    from memest_instrumentation.vllm.state import reset_state, state
    from vllm.v1.worker.gpu_worker import Worker

    for key, value in {"MEMEST_ENABLE": "1", **(env or {})}.items():
        monkeypatch.setenv(key, value)
    reset_state()
    calls: list[str] = []
    monkeypatch.setattr(Worker, "_scoped_allocator_max_split", _recording_scope(calls))
    monkeypatch.setattr(plan_path.gc, "collect", lambda: calls.append("gc") or 0)
    fake_cuda = types.SimpleNamespace(empty_cache=lambda: calls.append("empty_cache"))
    monkeypatch.setattr(measure, "cuda_ready", lambda: True)
    monkeypatch.setattr(measure, "_torch", lambda: types.SimpleNamespace(cuda=fake_cuda))
    monkeypatch.setattr(measure, "reset_peak", lambda: None)
    hooks._before_profile_run(runner, (), {})
    calls.append("profile_run")
    hooks._after_profile_run(runner, (), {}, None, None)
    assert state().plan.split_scope is None
    return calls


@pytest.mark.vllm
def test_a_bare_profile_run_runs_in_vllms_scope_then_the_cache_is_emptied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memest_instrumentation.vllm.state import state

    calls = _profile_run(monkeypatch, _runner(100 << 30))
    assert calls == ["enter 20 MiB", "profile_run", "exit", "gc", "empty_cache"]
    assert any("20 MiB split limit" in note for note in state().notes)


@pytest.mark.vllm
def test_the_profiling_path_and_the_switched_off_setting_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _profile_run(monkeypatch, _runner(None)) == ["profile_run"]
    off = {"MEMEST_PLAN_PATH_SPLIT": "0"}
    assert _profile_run(monkeypatch, _runner(100 << 30), off) == ["profile_run"]

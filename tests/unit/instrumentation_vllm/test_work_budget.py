"""memest never holds a vLLM start up: its own time is bounded and a slow hook is reported.

A cold EAGLE3 K=5 apply start was once seen sitting at drafter capture. Readings at stage edges
took allocator snapshots with the whole recorded history; they now read segments only, and past
MEMEST_WORK_BUDGET_S the plugin sheds its optional work.
"""

from __future__ import annotations

import logging
import time
import types
from typing import Any

import pytest
from memest_instrumentation.torch import _compat
from memest_instrumentation.vllm import recorder
from memest_instrumentation.vllm.env import Settings
from memest_instrumentation.vllm.state import guarded, reset_state


class _Rec:
    stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_work_past_the_budget_sheds_history_and_says_so() -> None:
    st = reset_state(Settings(enabled=True, work_budget_s=0.05))
    rec = _Rec()
    st.recorder = rec
    guarded("capture_stage", time.sleep, 0.08)
    assert st.shedding
    assert rec.stopped and st.recorder is None
    assert any("capture_stage" in n and "MEMEST_WORK_BUDGET_S" in n for n in st.notes)
    # no history is started once the budget is spent
    recorder.ensure_started("capture")
    assert st.recorder is None


def test_nested_guarded_calls_are_charged_once() -> None:
    st = reset_state(Settings(enabled=True))
    guarded("outer", lambda: guarded("inner", time.sleep, 0.02))
    assert set(st.work_s) == {"outer"}
    assert st.work_s["outer"] >= 0.02


def test_a_slow_hook_is_logged_with_its_stack_while_it_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    st = reset_state(Settings(enabled=True, slow_hook_s=0.2))

    def slow_reading() -> None:
        # Runs until the watchdog has reported it (the watchdog thread may still be in a sleep
        # sized by an earlier test's limit), bounded so a broken watchdog fails, not hangs.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("slow hook" in n for n in st.notes):
            time.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger="memest.vllm"):
        guarded("capture_stage", slow_reading)
    slow = [r for r in caplog.records if "has run" in r.getMessage()]
    assert len(slow) == 1
    assert "slow_reading" in slow[0].getMessage()
    assert "slow hook: capture_stage ran over 0.2 s" in st.notes


def _fake_torch(monkeypatch: pytest.MonkeyPatch, *, traceless: bool, history: bool) -> list[Any]:
    calls: list[Any] = []
    segments = [
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 2 << 20, "allocated_size": 512},
        {"device": 0, "segment_pool_id": (0, 3), "total_size": 20 << 20, "allocated_size": 0},
        {"device": 1, "segment_pool_id": (0, 3), "total_size": 99, "allocated_size": 0},
    ]
    if traceless:

        def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> Any:
            calls.append(include_traces)
            return segments
    else:

        def memory_snapshot(mempool_id: Any = None) -> Any:  # type: ignore[misc]
            calls.append("with traces")
            return segments

    cuda = types.SimpleNamespace(
        memory=types.SimpleNamespace(memory_snapshot=memory_snapshot),
        memory_snapshot=memory_snapshot,
    )
    fake = types.SimpleNamespace(
        cuda=cuda, _C=types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: history)
    )
    monkeypatch.setattr(_compat, "_torch", lambda: fake)
    return calls


def test_pool_readings_never_ask_for_the_history(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_torch(monkeypatch, traceless=True, history=True)
    assert _compat.pool_usage(0) == {"0,0": (2 << 20, 512), "0,3": (20 << 20, 0)}
    assert calls == [False]


def test_old_torch_reads_segments_only_while_no_history_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _fake_torch(monkeypatch, traceless=False, history=False)
    assert _compat.pool_reserved(0) == {"0,0": 2 << 20, "0,3": 20 << 20}
    calls.clear()
    _fake_torch(monkeypatch, traceless=False, history=True)
    with pytest.raises(RuntimeError, match="only with traces"):
        _compat.pool_usage(0)

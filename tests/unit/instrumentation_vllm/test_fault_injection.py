"""Each hook made to raise in turn, and the service unreachable: the wrapped method still
returns its value, and a warning is logged once per hook."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import fake_start
import pytest
from memest_instrumentation.vllm.state import reset_state, state

from memest.schema import RunReport

HOOKS = [
    "init_device",
    "init_device.after",
    "weights",
    "profile_run",
    "profile_run.before",
    "profile_run.after",
    "warm_profile",
    "graph_profiling",
    "graph_profiling.before",
    "graph_profiling.after",
    "determine_available_memory",
    "determine_available_memory.before",
    "determine_available_memory.after",
    "config",
    "startup_plan",
    "kv_cache_alloc",
    "kv_config",
    "kv_config.after",
    "capture",
    "capture_stage",
    "end_of_init",
    "end_of_init.after",
    "recorder",
    "analysis",
    "capture_plans",
    "estimate",
    "report",
    "report_file",
    "push",
    "all",
]

# A fake start runs memest's real hooks, which import torch and vLLM.
pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("needs_vllm")]


def _vllm_calls(calls: list[str]) -> list[str]:
    """The calls vLLM made: without memest's own second, warm profile pass."""
    first = calls.index("profile_run")
    return calls[: first + 1] + [c for c in calls[first + 1 :] if c != "profile_run"]


def _expected() -> dict[str, object]:
    return {
        "init_device": None,
        "load_model": None,
        "determine_available_memory": fake_start.RETURNS["determine_available_memory"],
        "initialize_from_config": None,
        "compile_or_warm_up_model": fake_start.RETURNS["compile_or_warm_up_model"],
    }


def _run(monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[dict[str, object], list[str]]:
    from memest_instrumentation.vllm import collect

    monkeypatch.setattr(collect, "compute_fingerprint", lambda worker: "0123456789abcdef")
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_RUN_ID", "fault")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reset_state()
    worker, methods = fake_start.build_start()
    out = fake_start.run_start(worker, methods)
    return out, worker.calls


def test_without_faults_a_report_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out, calls = _run(monkeypatch)
    assert out == _expected()
    path = tmp_path / "out" / "fault" / "report.rank0.json"
    report = RunReport.model_validate(json.loads(path.read_text()))
    names = [p.name for p in report.phases]
    for name in ("weights", "profile_run", "graph_profiling", "kv_cache_alloc", "capture", "end"):
        assert name in names
    stages = {(s.phase, s.stage) for s in report.breakdown.stages} if report.breakdown else set()
    assert ("graph_profiling", "target.piecewise") in stages
    assert ("capture", "target.full") in stages
    assert ("capture", "draft.step0.piecewise") in stages
    assert report.kv_cache is not None and report.kv_cache.num_blocks == 1000
    assert [p.sizing for p in report.capture_plans] == ["seed", "vllm-0.33.0"]
    assert report.config.max_num_seqs == 4 and report.config.cudagraph_capture_sizes == [4, 8]
    assert any(n.startswith("graph memory: vLLM estimate") for n in report.notes)


@pytest.mark.parametrize("hook", HOOKS)
def test_a_raising_hook_never_changes_what_vllm_gets(
    hook: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, clean_calls = _run(monkeypatch)
    assert state().hook_errors == []
    caplog.clear()
    # An unreachable service too, so that the push hook runs.
    extra = {"MEMEST_SERVICE_URL": "http://127.0.0.1:9", "MEMEST_PUSH_RETRIES": "1"}
    with caplog.at_level(logging.WARNING, logger="memest.vllm"):
        out, calls = _run(monkeypatch, MEMEST_FAULT=hook, **extra)
    assert out == _expected()
    assert _vllm_calls(calls) == _vllm_calls(clean_calls)
    st = state()
    failed = {e.split(":")[0] for e in st.hook_errors}
    if hook != "all":
        assert hook in failed, st.hook_errors
        warnings = [r for r in caplog.records if f"memest hook {hook} failed" in r.getMessage()]
        assert len(warnings) == 1
    else:
        assert len(failed) > 5
        per_hook = [r.getMessage().split()[2] for r in caplog.records]
        assert len(per_hook) == len(set(per_hook)), "a hook warned twice"


def test_unreachable_service_spools_and_start_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="memest.vllm"):
        out, _ = _run(
            monkeypatch,
            MEMEST_SERVICE_URL="http://127.0.0.1:9",
            MEMEST_PUSH_TIMEOUT_S="2",
            MEMEST_PUSH_RETRIES="2",
        )
    assert out == _expected()
    assert (tmp_path / "out" / "spool" / "fault.rank0.json").exists()
    report = json.loads((tmp_path / "out" / "fault" / "report.rank0.json").read_text())
    assert any(e.startswith("push: ") for e in report["hook_errors"])
    assert len([r for r in caplog.records if "memest hook push failed" in r.getMessage()]) == 1


def test_register_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import memest_instrumentation.vllm as plugin

    monkeypatch.setenv("MEMEST_ENABLE", "1")
    reset_state()

    def boom() -> list[str]:
        raise RuntimeError("vLLM moved")

    monkeypatch.setattr(plugin, "instrument_on_import", boom)
    plugin.register()
    assert any("vLLM moved" in e for e in state().hook_errors)

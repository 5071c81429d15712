"""Each hook made to raise in turn, and the service unreachable: the wrapped method still
returns its value, and a warning is logged once per hook."""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import fake_start
import pytest
from memest_instrumentation.vllm.state import reset_state, state

from memest.schema import RunConfig, RunReport

PLUGIN = Path(__file__).resolve().parents[3] / "instrumentation/memest_instrumentation/vllm"


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _assigned(name: str, scopes: list[ast.AST]) -> set[str] | None:
    """The string constants assigned to ``name`` in the innermost enclosing function that
    assigns it (``name = "a" if x else "b"``), or None when none does."""
    for scope in reversed(scopes):
        for n in ast.walk(scope):
            targets = n.targets if isinstance(n, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return _strings(n.value)  # type: ignore[union-attr]
    return None


def _hooks_in(node: ast.AST, scopes: list[ast.AST], path: Path) -> set[str]:
    """Hook names of one call: ``guarded(hook, ...)`` and ``phase_wrapper(name, hook, ...)``
    (which guards ``hook``, and ``hook.before`` / ``hook.after`` when given those callbacks)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
        return set()
    first = node.args[0]
    if node.func.id == "phase_wrapper":
        hook = node.args[1]
        assert isinstance(hook, ast.Constant), f"{path}:{node.lineno}: hook not a literal"
        edges = {k.arg for k in node.keywords} & {"before", "after"}
        return {hook.value, *(f"{hook.value}.{edge}" for edge in edges)}
    if node.func.id != "guarded" or isinstance(first, ast.JoinedStr):
        return set()  # phase_wrapper's own f"{hook}.before": its call sites are read above
    if isinstance(first, ast.Constant):
        return {first.value}
    assert isinstance(first, ast.Name), f"{path}:{node.lineno}: hook name not a literal"
    if first.id == "hook" and any(getattr(s, "name", "") == "phase_wrapper" for s in scopes):
        return set()
    names = _assigned(first.id, scopes)
    assert names, f"{path}:{node.lineno}: hook name {first.id} not found"
    return names


def guarded_hooks() -> set[str]:
    """Every hook name the plugin's code runs fail-open (read from the code, not listed)."""
    found: set[str] = set()

    def visit(node: ast.AST, scopes: list[ast.AST], path: Path) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scopes = [*scopes, node]
        found.update(_hooks_in(node, scopes, path))
        for child in ast.iter_child_nodes(node):
            visit(child, scopes, path)

    for path in sorted(PLUGIN.glob("*.py")):
        visit(ast.parse(path.read_text()), [], path)
    return found


HOOKS = [*sorted(guarded_hooks()), "all"]


def test_the_hook_list_is_read_from_the_code() -> None:
    """A sample the reader can check by eye: one hook of each kind the reader above handles."""
    hooks = set(HOOKS)
    assert {"recorder", "push", "model_dims", "compiled_code"} <= hooks  # guarded("...")
    assert {"weights", "profile_run.before", "end_of_init.after"} <= hooks  # phase_wrapper
    assert {"capture", "graph_profiling.capture"} <= hooks  # name = "..." if ... else "..."


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


#: An unreachable service, so that the push hook runs.
UNREACHABLE_SERVICE = {"MEMEST_SERVICE_URL": "http://127.0.0.1:9", "MEMEST_PUSH_RETRIES": "1"}


def _v1_capture(monkeypatch: pytest.MonkeyPatch) -> object:
    """Model Runner V1's capture_model, wrapped as the plugin wraps it (the fake start is V2)."""
    from memest_instrumentation.vllm.hooks import PATCHES

    patch = next(p for p in PATCHES if p.name == "capture" and p.runner == "v1")
    return patch.make(lambda self: "captured")(SimpleNamespace())


def _v1_allocate_kv_cache(monkeypatch: pytest.MonkeyPatch) -> object:
    """Model Runner V1's allocate_kv_cache, wrapped as the plugin wraps it."""
    from memest_instrumentation.vllm.hooks import wrap_allocate_kv_cache

    return wrap_allocate_kv_cache(lambda cfg: "allocated")(SimpleNamespace(kv_cache_tensors=[]))


def _mla_context(monkeypatch: pytest.MonkeyPatch) -> object:
    """Apply mode's MLA context term (a start with a config; the fake start's model is not MLA,
    so its apply path returns before this hook)."""
    from memest_instrumentation.vllm import apply

    state().config = RunConfig(model="m")
    return apply._mla_context_bytes(SimpleNamespace(vllm_config=None))


def _growable_worker() -> SimpleNamespace:
    kv_cache = SimpleNamespace(
        capacity_blocks=100,
        bytes_per_block=1 << 20,
        reserved_headroom_bytes=1 << 30,
        torch_reserve_growth_bytes=0,
        torch_memory_limit=None,
        num_committed_blocks=40,
        physical_bytes=40 << 20,
    )
    return SimpleNamespace(
        cache_config=SimpleNamespace(enable_extensible_kv_cache=True),
        model_runner=SimpleNamespace(extensible_kv_cache=kv_cache),
    )


def _kv_cache_sizing(monkeypatch: pytest.MonkeyPatch) -> object:
    """vLLM 0.34's growable-cache sizing in apply mode: measure_kv_cache_blocks calling
    measure_kv_cache_bytes, both wrapped as the plugin wraps them (stand-ins for vLLM's)."""
    from memest_instrumentation.vllm.extensible import (
        wrap_measure_kv_cache_blocks,
        wrap_measure_kv_cache_bytes,
    )

    monkeypatch.setenv("MEMEST_ESTIMATE", "apply")
    reset_state()
    measure_bytes = wrap_measure_kv_cache_bytes(lambda **kw: 60 << 20)
    readings = {"init_free_memory": 1 << 33, "free_memory": 1 << 32, "committed_bytes": 0}

    def measure_blocks(kv_cache: object, *args: object, **kwargs: object) -> int:
        return int(measure_bytes(**readings, requested_memory=1 << 33)) >> 20

    worker = _growable_worker()
    return wrap_measure_kv_cache_blocks(measure_blocks)(worker.model_runner.extensible_kv_cache)


def _kv_cache_extend(monkeypatch: pytest.MonkeyPatch) -> object:
    """vLLM 0.34's Worker.extend_kv_cache, wrapped as the plugin wraps it (the report follows)."""
    from memest_instrumentation.vllm.hooks import EXTENSIBLE_PATCHES

    patch = next(p for p in EXTENSIBLE_PATCHES if p.name == "kv_cache_extend")
    return patch.make(lambda self, num_blocks: "extended")(_growable_worker(), 40)


def _serving_step(monkeypatch: pytest.MonkeyPatch) -> object:
    """Apply mode's full-batch step reserve (a start with a config; the fake start has none)."""
    from memest_instrumentation.vllm import apply

    state().config = RunConfig(model="m")
    return apply._serving_step_bytes()


#: Hooks the fake start does not reach, each driven through the code that guards it, with what
#: that code must still return to vLLM when the hook raises.
DIRECT: dict[str, tuple[Callable[[pytest.MonkeyPatch], object], object]] = {
    "capture.before": (_v1_capture, "captured"),
    "allocate_kv_cache": (_v1_allocate_kv_cache, "allocated"),
    "mla_context": (_mla_context, 0),
    "serving_step": (_serving_step, 0),
    "kv_cache_sizing": (_kv_cache_sizing, 60),
    "kv_cache_extend": (_kv_cache_extend, "extended"),
    "kv_cache_extend.after": (_kv_cache_extend, "extended"),
}


def test_every_guarded_hook_is_exercised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each hook the code guards runs in the fake start, or is driven directly (DIRECT)."""
    from memest_instrumentation.vllm import state as state_module

    reached: set[str] = set()
    real = state_module.maybe_fault

    def spy(hook: str) -> None:
        reached.add(hook)
        real(hook)

    monkeypatch.setattr(state_module, "maybe_fault", spy)
    _run(monkeypatch, **UNREACHABLE_SERVICE)
    assert set(HOOKS) - {"all"} - reached == set(DIRECT)


def _direct(hook: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    drive, value = DIRECT[hook]
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_FAULT", hook)
    reset_state()
    with caplog.at_level(logging.WARNING, logger="memest.vllm"):
        assert drive(monkeypatch) == value
    assert hook in {e.split(":")[0] for e in state().hook_errors}, state().hook_errors
    assert len([r for r in caplog.records if f"memest hook {hook} failed" in r.getMessage()]) == 1


@pytest.mark.parametrize("hook", HOOKS)
def test_a_raising_hook_never_changes_what_vllm_gets(
    hook: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if hook in DIRECT:
        _direct(hook, monkeypatch, caplog)
        return
    _, clean_calls = _run(monkeypatch)
    assert state().hook_errors == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memest.vllm"):
        out, calls = _run(monkeypatch, MEMEST_FAULT=hook, **UNREACHABLE_SERVICE)
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

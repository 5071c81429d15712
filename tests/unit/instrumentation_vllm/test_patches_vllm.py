"""The patches against vLLM 0.33.0's real classes (CPU: the classes import without a GPU)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import memest_instrumentation.vllm as plugin
import pytest
from conftest import vllm_or_skip
from memest_instrumentation.vllm.patches import (
    ORIGINAL_ATTR,
    Patch,
    apply_patch,
    current,
    original,
    signature_problem,
)


@pytest.fixture(autouse=True)
def _vllm() -> Iterator[None]:
    vllm_or_skip()
    plugin.uninstrument()
    yield
    plugin.uninstrument()


def _holders() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in plugin.patches():
        mod = importlib.import_module(p.module)
        holder = getattr(mod, p.owner) if p.owner else mod
        out[f"{p.module}.{p.owner}"] = holder
    return out


def _state(holders: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: dict(vars(h)) for name, h in holders.items()}


@pytest.mark.parametrize("patch", plugin.patches(), ids=lambda p: f"{p.runner}:{p.target}")
def test_every_target_exists_with_the_expected_signature(patch: Patch) -> None:
    assert signature_problem(patch) is None


def test_a_renamed_method_is_reported_not_raised() -> None:
    base = plugin.patches()[0]
    renamed = Patch(base.name, base.module, base.owner, "init_device_v2", base.params, base.make)
    problem = signature_problem(renamed)
    assert problem is not None and "init_device_v2 is missing" in problem
    assert apply_patch(renamed) == problem
    changed = Patch(base.name, base.module, base.owner, base.attr, ("self", "device"), base.make)
    problem = signature_problem(changed)
    assert problem is not None and "expects them to start with ('self', 'device')" in problem


def test_instrument_then_uninstrument_leaves_every_class_as_it_was() -> None:
    holders = _holders()
    before = _state(holders)
    assert plugin.instrument() == []
    during = _state(holders)
    for p in plugin.patches():
        assert hasattr(current(p), ORIGINAL_ATTR), p.target
        assert (
            during[f"{p.module}.{p.owner}"][p.attr] is not before[f"{p.module}.{p.owner}"][p.attr]
        )
    plugin.uninstrument()
    after = _state(holders)
    assert after.keys() == before.keys()
    for name in before:
        assert after[name].keys() == before[name].keys(), name
        for attr, value in before[name].items():
            assert after[name][attr] is value, f"{name}.{attr}"
    plugin.uninstrument()  # idempotent
    assert _state(holders) == after


def test_loading_twice_patches_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEST_ENABLE", "1")
    from memest_instrumentation.vllm.state import reset_state

    reset_state()
    plugin.register()
    first = {p.target: current(p) for p in plugin.patches()}
    plugin.register()
    assert plugin.instrument() == []
    for p in plugin.patches():
        now = current(p)
        assert now is first[p.target]
        assert not hasattr(getattr(now, ORIGINAL_ATTR), ORIGINAL_ATTR), "wrapped twice"


def test_disabled_register_patches_nothing() -> None:
    plugin.register()
    for p in plugin.patches():
        assert not hasattr(current(p), ORIGINAL_ATTR)


def test_vllm_load_general_plugins_finds_and_runs_the_entry_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vllm.plugins as vp

    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("VLLM_PLUGINS", "memest")
    monkeypatch.setattr(vp, "plugins_loaded", False)
    from memest_instrumentation.vllm.state import reset_state

    reset_state()
    found = vp.load_plugins_by_group(vp.DEFAULT_PLUGINS_GROUP)
    assert "memest" in found
    assert original(found["memest"]) is plugin.register
    vp.load_general_plugins()  # type: ignore[no-untyped-call]
    assert all(hasattr(current(p), ORIGINAL_ATTR) for p in plugin.patches())

"""Loading the plugin is near-free: vLLM loads it in processes that never start a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import memest_instrumentation.vllm as plugin
import pytest
from conftest import vllm_or_skip
from memest_instrumentation.vllm.hooks import PATCHES_BY_VERSION
from memest_instrumentation.vllm.targets import MODULES_BY_VERSION

ROOT = Path(__file__).resolve().parents[3]


def _run(code: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEST_")}
    env["MEMEST_ENABLE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "instrumentation")])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_every_patched_module_is_watched() -> None:
    assert {p.module for p in plugin.patches()} == set(plugin.modules())
    for release, patches in PATCHES_BY_VERSION.items():
        assert {p.module for p in patches} == set(MODULES_BY_VERSION[release]), release


def test_an_unsupported_vllm_gets_one_warning_and_no_patch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.35.0")
    monkeypatch.setattr(plugin, "_WARNED", set())
    with caplog.at_level("WARNING", logger="memest.vllm"):
        assert plugin.patches() == ()
        assert plugin.instrument_on_import() == []
        assert plugin.instrument() == []
    warnings = [r.getMessage() for r in caplog.records if "0.35.0" in r.getMessage()]
    assert warnings == [
        "memest: vLLM 0.35.0 is not supported (supported: 0.33.0, 0.34.0); "
        "the plugin installs nothing"
    ]


def test_register_imports_nothing_heavy() -> None:
    loaded = _run(
        "import json, sys\n"
        "import memest_instrumentation.vllm as p\n"
        "p.register()\n"
        "heavy = ('memest.schema', 'memest.analysis', 'memest.estimate', 'pydantic', 'torch',"
        " 'vllm', 'memest_instrumentation.vllm.hooks', 'memest_instrumentation.vllm.state')\n"
        "print(json.dumps({'heavy': sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or m in heavy)}))\n"
    )
    assert loaded["heavy"] == []


def test_patches_go_in_when_vllm_imports_their_module() -> None:
    vllm_or_skip()
    found = _run(
        "import json, inspect, sys\n"
        "import memest_instrumentation.vllm as p\n"
        "p.register()\n"
        "assert 'vllm.v1.worker.gpu_worker' not in sys.modules\n"
        "import vllm.v1.worker.gpu_worker as gw\n"
        "from memest_instrumentation.vllm.patches import is_patched, ORIGINAL_ATTR\n"
        "from memest_instrumentation.vllm.state import state\n"
        "loaded = [q for q in p.patches() if q.module in sys.modules]\n"
        "print(json.dumps({'patched': all(is_patched(q) for q in loaded),\n"
        "  'worker': hasattr(gw.Worker.__dict__['init_device'], ORIGINAL_ATTR),\n"
        "  'loader': type(gw.__loader__).__name__, 'source': bool(inspect.getsource(gw)),\n"
        "  'errors': state().hook_errors}))\n"
    )
    assert found == {
        "patched": True,
        "worker": True,
        "loader": "SourceFileLoader",
        "source": True,
        "errors": [],
    }

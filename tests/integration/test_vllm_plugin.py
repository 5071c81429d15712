"""vLLM 0.33.0 loads the memest plugin through its own entry-point machinery, in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, os
import vllm.plugins as vp
vp.load_general_plugins()
vp.load_general_plugins()          # vLLM calls it from several places
vp.plugins_loaded = False
vp.load_general_plugins()          # and a second load in one process must not re-wrap
import memest_instrumentation.vllm as plugin
from memest_instrumentation.vllm.patches import ORIGINAL_ATTR, current
from memest_instrumentation.vllm.state import state
out = {}
for p in plugin.patches():
    obj = current(p)
    inner = getattr(obj, ORIGINAL_ATTR, None)
    out[p.target] = [inner is not None, inner is not None and hasattr(inner, ORIGINAL_ATTR)]
print("PROBE " + json.dumps({"patched": out, "errors": state().hook_errors, "run_id": state().run_id}))
"""


def _probe(env_extra: dict[str, str]) -> dict[str, object]:
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        from tests.conftest import require_or_skip

        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM 0.33.0 is not importable: {exc}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEST_")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "instrumentation")])
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(lines[-1][len("PROBE ") :])
    return result


@pytest.mark.vllm
def test_entry_point_patches_every_target_once_when_enabled() -> None:
    res = _probe({"MEMEST_ENABLE": "1", "MEMEST_RUN_ID": "it"})
    patched = res["patched"]
    assert isinstance(patched, dict) and patched
    for target, (wrapped, wrapped_twice) in patched.items():
        assert wrapped, target
        assert not wrapped_twice, target
    assert res["errors"] == [] and res["run_id"] == "it"

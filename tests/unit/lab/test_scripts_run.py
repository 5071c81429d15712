"""lab scripts run both ways from the repository root with nothing installed: as
``python3 lab/X.py`` (the device harness's commands in reports/vllm/README.md) and as
``python -m lab.X``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("script", ["vllm_runs", "serve_runs", "preflight_fit", "preflight_check"])
@pytest.mark.parametrize("way", ["path", "module"])
def test_a_script_starts_from_the_repository_root(script: str, way: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [f"lab/{script}.py"] if way == "path" else ["-m", f"lab.{script}"]
    out = subprocess.run(
        [sys.executable, *command, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")

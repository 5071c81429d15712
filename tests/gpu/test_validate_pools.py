"""Runs lab/validate_pools.py on a CUDA machine (pytest --run-gpu) and requires all checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_validate_pools(tmp_path: Path) -> None:
    env = dict(
        os.environ, OUT=str(tmp_path), PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'instrumentation'}"
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "lab/validate_pools.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = json.loads((tmp_path / "validate_pools.json").read_text())
    failed = [c for c in summary["checks"] if not c["ok"] and "not asserted" not in c["check"]]
    assert not failed, (failed, proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0

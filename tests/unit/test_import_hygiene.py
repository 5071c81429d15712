"""The core never imports torch, fastapi or sqlalchemy (DESIGN.md: imports flow one way)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_core_imports_no_heavy_dependency() -> None:
    code = (
        "import sys, json\n"
        "import memest, memest.schema, memest.plan, memest.analysis, memest.estimate, memest.units, memest.preflight\n"
        "print(json.dumps(sorted(m for m in ('torch','fastapi','sqlalchemy','vllm') "
        "if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []

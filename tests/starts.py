"""The recorded H200 starts under tests/data/starts: the one reader of a harness record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STARTS = Path(__file__).resolve().parent / "data" / "starts"


def harness_record(call: str, config: str, mode: str) -> dict[str, Any]:
    """The line of ``results.<call>.jsonl`` (lab/vllm_runs.py's record) for one start."""
    for line in (STARTS / f"results.{call}.jsonl").read_text().splitlines():
        rec: dict[str, Any] = json.loads(line)
        if rec["config"] == config and rec["mode"] == mode:
            return rec
    raise AssertionError(f"{call} has no start {config}/{mode}")

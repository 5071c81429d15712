#!/usr/bin/env python3
"""Replay of memest's warm profile pass from a kept allocator history, without the drafter's block
routine: what the activation term and the apply budget would have been. A replay, not a start.

The plugin's warm pass (instrumentation/memest_instrumentation/vllm/warm_pass.py) now leaves out
a DFlash / DSpark drafter's ``_generate_draft`` when its FULL graphs cover every batch (serving
replays it; its memory is in the graph-pool term). For a start recorded before that change, the
history holds the pass's every allocator event: the events between the first and the last one
whose stack holds ``warm_profile_peak``. They are fed, from an empty cache as the pass starts,
through memest's model of the caching allocator (memest.estimate.allocsim) twice: as recorded
(on call 30 the model's figure is 16 MiB above the recorded segments, so only the difference
of the two replays is used) and without the allocations made inside
``_generate_draft``. The difference moves memest's KV budget; the start's serving steps
(lab/vllm_runs.py's records) then say where serving's peak would have stood against the budget.

Usage (no GPU):
    python lab/warm_pass_replay.py SNAPSHOT.json.gz REPORT.json RESULTS.jsonl [--mode apply-hist]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memest.estimate.allocsim import PoolSim  # noqa: E402
from memest.schema import RunReport  # noqa: E402
from memest.snapshot import load_snapshot  # noqa: E402
from memest.units import GiB  # noqa: E402

PASS_FRAME = "warm_profile_peak"
SKIPPED_FRAME = "_generate_draft"


def _has(snap: dict[str, Any], stack: int, name: str) -> bool:
    return stack >= 0 and any(snap["frames"][j][2] == name for j in snap["stacks"][stack])


def warm_window(snap: dict[str, Any]) -> range:
    """Indices of the warm pass's events: first to last event whose stack holds the pass."""
    ev = snap["events"]
    hits = [i for i, st in enumerate(ev["stack"]) if _has(snap, st, PASS_FRAME)]
    if not hits:
        raise SystemExit("no warm profile pass in this history")
    return range(hits[0], hits[-1] + 1)


def replay(snap: dict[str, Any], window: range, skip_frame: str | None) -> int:
    """Reserved bytes the pass adds from an empty cache, allocations under ``skip_frame`` left
    out (their frees too)."""
    ev, acts = snap["events"], snap["actions"]
    alloc = acts.index("alloc")
    free = acts.index("free_completed" if "free_completed" in acts else "free_requested")
    sim, live, skipped, handle = PoolSim(), {}, set(), 0
    for i in window:
        a, addr = ev["action"][i], ev["addr"][i]
        if a == alloc:
            if skip_frame and _has(snap, ev["stack"][i], skip_frame):
                skipped.add(addr)
                continue
            handle += 1
            live[addr] = handle
            sim.alloc(handle, ev["size"][i], ev["stream"][i])
        elif a == free:
            if addr in skipped:
                skipped.discard(addr)
            elif addr in live:
                sim.free(live.pop(addr))
    return sim.result().reserved_bytes


def measured_growth(snap: dict[str, Any], window: range, under: str | None = None) -> int:
    """Segments the pass reserved, as the history recorded them (only those reserved inside
    ``under``, given a frame name)."""
    ev, acts = snap["events"], snap["actions"]
    seg = acts.index("segment_alloc")
    return sum(
        ev["size"][i]
        for i in window
        if ev["action"][i] == seg and (under is None or _has(snap, ev["stack"][i], under))
    )


def figures(snap_path: Path, report_path: Path, results: Path, mode: str) -> dict[str, Any]:
    snap = load_snapshot(snap_path)
    report = RunReport.model_validate_json(report_path.read_text())
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    row = next(
        r
        for r in rows
        if r["config"] in report.run_id and r["mode"] == mode and r.get("step_usage_bytes")
    )
    window = warm_window(snap)
    measured = measured_growth(snap, window)
    as_recorded = replay(snap, window, None)
    without = replay(snap, window, SKIPPED_FRAME)
    assert report.estimate is not None and report.kv_cache is not None
    comps = report.estimate.components
    page = report.kv_cache.page_size_bytes
    kv = comps["memest_kv_bytes"]
    blocks, blocks_replay = kv // page, (kv + as_recorded - without) // page
    peak = max(row["step_usage_bytes"], row["context_step_usage_bytes"])
    budget = row["budget_bytes"]
    return {
        "warm_pass_reserved_bytes": measured,
        "segments_reserved_in_draft_block_bytes": measured_growth(snap, window, SKIPPED_FRAME),
        "activation_term_bytes": comps["profile_peak_activation_bytes"],
        "replay_as_recorded_bytes": as_recorded,
        "replay_without_draft_block_bytes": without,
        "kv_blocks": blocks,
        "kv_blocks_replay": blocks_replay,
        "serving_peak_minus_budget_bytes": peak - budget,
        "replay_serving_peak_minus_budget_bytes": peak + (blocks_replay - blocks) * page - budget,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("report", type=Path)
    ap.add_argument("results", type=Path, help="the start's results.call*.jsonl")
    ap.add_argument("--mode", default="apply-hist")
    args = ap.parse_args(argv)
    out = figures(args.snapshot, args.report, args.results, args.mode)
    for key, value in out.items():
        gib = f" ({value / GiB:+.3f} GiB)" if key.endswith("budget_bytes") else ""
        print(f"{key}: {value}{gib}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

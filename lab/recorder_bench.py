"""The recorder's cost on CUDA-graph capture, each variant in a fresh process (GPU; lab tooling).

`lab/validate_pools.py` times its variants one after another in one process, after torch's
history recording has been switched on and off, which torch does not fully undo
(pytorch/pytorch#153571): its variant figures are not clean splits. Here every variant runs in a
process of its own, the variants in rotating order over several rounds, on validate_pools'
layered workload (9 capture sizes x 32 layers of linear + SiLU + residual, eager warm-up before
each capture, one shared pool). Target: memest's full recorder <= 1.10x of capture time off.

Run: PYTHONPATH=.:instrumentation:lab python lab/recorder_bench.py [--rounds 4]
     (writes $OUT/recorder_bench.json; prints one line per variant)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

VARIANTS = {
    "off": "no recording",
    "torch_history": "torch's history alone, as memest starts it (context=alloc, python stacks)",
    "memest_tags": "memest's tags and graph hooks, no history",
    "memest_full": "memest's recorder: history + tags + graph hooks (what MEMEST_HISTORY runs)",
}
REPEATS = 7  # captures timed per process; the median counts


def child(variant: str) -> dict[str, Any]:
    import tempfile

    from lab.carry import CARRY, launcher

    # the device image has torch but not pydantic: the carried site has it (as for vLLM)
    launcher().prepare_site(str(CARRY), os.path.join(tempfile.gettempdir(), "vllm_h200_site"))
    import torch
    from memest_instrumentation.torch import Recorder

    from lab.validate_pools import Layered, release

    work = Layered()
    work.run(None)  # cuBLAS handles, workspaces and kernels loaded before any timing
    release(work.graphs)
    rec = None
    if variant == "torch_history":
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=1_000_000
        )
    elif variant in ("memest_tags", "memest_full"):
        history = variant == "memest_full"
        rec = Recorder(history=history, max_entries=1_000_000, stacks="python").start()
    times = []
    for _ in range(REPEATS):
        times.append(work.run(rec))
        release(work.graphs)
    events = len(rec.snapshot()["events"]["action"]) if variant == "memest_full" and rec else 0
    return {
        "variant": variant,
        "median_s": statistics.median(times),
        "times_s": times,
        "events": events,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child)), flush=True)
        return 0
    names = list(VARIANTS)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", name], capture_output=True, text=True
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs[name].append(json.loads(line[len("RESULT ") :]))
    off = statistics.median(run["median_s"] for run in runs["off"])
    summary: dict[str, Any] = {"rounds": args.rounds, "repeats": REPEATS, "variants": {}}
    for name in names:
        median = statistics.median(run["median_s"] for run in runs[name])
        summary["variants"][name] = {
            "what": VARIANTS[name],
            "median_ms": round(median * 1e3, 3),
            "ratio_to_off": round(median / off, 4),
            "per_process_ms": [round(run["median_s"] * 1e3, 3) for run in runs[name]],
        }
        print(f"{name:14s} {median * 1e3:8.2f} ms  {median / off:5.3f}x  ({VARIANTS[name]})")
    events = [run["events"] for run in runs["memest_full"]]
    summary["events_per_capture_run"] = statistics.median(events) / REPEATS
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "recorder_bench.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

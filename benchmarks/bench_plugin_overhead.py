#!/usr/bin/env python3
"""Start-time overhead of the memest vLLM plugin.

Two figures:
- ``--results FILE``: from H200 start records (lab/vllm_runs.py, results.jsonl), the
  ratio of LLM() construction time with MEMEST_ENABLE=1 over without, per configuration.
- default: the wrappers' own cost on CPU — a vLLM-shaped start of stand-in methods
  (tests/unit/instrumentation_vllm/fake_start.py) driven with the plugin off and on, no device
  readings; prints milliseconds per start. Device-side costs (allocator history, snapshots,
  analysis) are only in the first figure.

    python benchmarks/bench_plugin_overhead.py [--results reports/vllm/raw/results.call1.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def from_results(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_cfg: dict[str, dict[str, float]] = {}
    for r in rows:
        if "start_s" in r:
            by_cfg.setdefault(r["config"], {})[r["mode"]] = float(r["start_s"])
    for cfg, modes in sorted(by_cfg.items()):
        if "alone" in modes and "enable" in modes:
            ratio = modes["enable"] / modes["alone"]
            print(
                f"{cfg}: vLLM alone {modes['alone']:.1f} s, MEMEST_ENABLE=1 "
                f"{modes['enable']:.1f} s -> {ratio:.2f}x"
            )


def cpu_wrappers(repeat: int) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "unit" / "instrumentation_vllm"))
    import fake_start
    from memest_instrumentation.vllm import collect
    from memest_instrumentation.vllm.state import reset_state

    collect.compute_fingerprint = lambda worker: "0123456789abcdef"  # no vLLM platform on CPU
    out = tempfile.mkdtemp(prefix="memest-bench-")
    os.environ["MEMEST_OUTPUT_DIR"] = out
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeat):
        for mode in ("off", "on"):
            os.environ["MEMEST_ENABLE"] = "1" if mode == "on" else "0"
            os.environ["MEMEST_HISTORY_MAX_ENTRIES"] = "0"
            reset_state()
            worker, methods = fake_start.build_start()
            t0 = time.perf_counter()
            fake_start.run_start(worker, methods)
            times[mode].append(time.perf_counter() - t0)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(
        f"stand-in start, median of {repeat}: plugin off {off * 1e3:.2f} ms, on {on * 1e3:.2f} ms "
        f"(+{(on - off) * 1e3:.2f} ms of wrapper, report assembly and file write per start)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    if args.results:
        from_results(args.results)
    else:
        cpu_wrappers(args.repeat)


if __name__ == "__main__":
    main()

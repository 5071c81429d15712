#!/usr/bin/env python3
"""Start-time overhead of the memest vLLM plugin.

Figures:
- ``--results FILE``: from H200 start records (lab/vllm_runs.py, results.jsonl), the
  ratio of LLM() construction time with MEMEST_ENABLE=1 over without, per configuration.
- default, on CPU:
  - loading the plugin (MEMEST_ENABLE=1), each in a fresh interpreter, median of
    ``--load-repeat``: the import of ``memest_instrumentation.vllm`` and ``register()`` in a bare
    interpreter (cold), then the same in a process that has imported what vLLM's API server
    has when it loads general plugins (``vllm.entrypoints.openai.api_server``): the time memest
    adds to every process that loads general plugins without starting a worker, and the modules
    it imports there. ``--root`` points at another checkout (e.g. ``git archive`` of an older
    commit) for before/after figures.
  - the wrappers' own cost — a vLLM-shaped start of stand-in methods
    (tests/unit/instrumentation_vllm/fake_start.py) driven with the plugin off and on, no device
    readings; prints milliseconds per start. Device-side costs (allocator history, snapshots,
    the warm profile pass, analysis) are only in the ``--results`` figure.

    python benchmarks/bench_plugin_overhead.py [--results reports/vllm/raw/results.call1.jsonl]
    python benchmarks/bench_plugin_overhead.py [--root OTHER_CHECKOUT] [--load-repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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


_LOAD = """
import json, sys, time
{preload}
before = set(sys.modules)
t0 = time.perf_counter()
import memest_instrumentation.vllm as plugin
t1 = time.perf_counter()
plugin.register()
t2 = time.perf_counter()
{worker}
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "register_s": t2 - t1, "worker_s": t3 - t2,
                  "modules": len(set(sys.modules) - before)}}))
"""
# A worker process has vLLM's worker modules; the plugin's hooks and end-of-init modules (the
# report schema, the plan and estimate code they need) come on top.
_WORKER_VLLM = "import vllm.v1.worker.gpu_worker, vllm.v1.worker.gpu.model_runner"
_WORKER = "import memest_instrumentation.vllm.hooks, memest_instrumentation.vllm.finish"


def _load_once(root: Path, preload: str, worker: str = "") -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEST_")}
    env["MEMEST_ENABLE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "instrumentation")])
    out = subprocess.run(
        [sys.executable, "-c", _LOAD.format(preload=preload, worker=worker)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    )
    row: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def plugin_load(root: Path, repeat: int) -> None:
    """Import and register() of the plugin, each in a fresh interpreter (median of repeat)."""
    api = "import vllm.entrypoints.openai.api_server"
    cases = (
        ("bare interpreter (cold)", "", ""),
        ("after vLLM's API-server imports", api, ""),
        ("worker process (vLLM's worker modules loaded)", f"{api}\n{_WORKER_VLLM}", _WORKER),
    )
    print(f"plugin load from {root}, MEMEST_ENABLE=1, median of {repeat} fresh interpreters:")
    for label, preload, worker in cases:
        try:
            rows = [_load_once(root, preload, worker) for _ in range(repeat)]
        except subprocess.CalledProcessError as exc:
            print(f"  {label}: failed ({exc.stderr.strip().splitlines()[-1:]})")
            continue
        imp = statistics.median(r["import_s"] for r in rows)
        reg = statistics.median(r["register_s"] for r in rows)
        mods = statistics.median(r["modules"] for r in rows)
        line = f"  {label}: import {imp * 1e3:.1f} ms, register() {reg * 1e3:.1f} ms"
        if worker:
            total = statistics.median(r["register_s"] + r["worker_s"] for r in rows)
            line += f", register() + the plugin's worker modules {total * 1e3:.1f} ms"
        else:
            line += f", {mods:.0f} modules imported"
        print(line)


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
    ap.add_argument("--load-repeat", type=int, default=5)
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose plugin is loaded")
    args = ap.parse_args()
    if args.results:
        from_results(args.results)
    else:
        plugin_load(args.root.resolve(), args.load_repeat)
        cpu_wrappers(args.repeat)


if __name__ == "__main__":
    main()

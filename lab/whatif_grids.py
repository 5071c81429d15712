#!/usr/bin/env python3
"""The what-if on real vLLM: one start of A predicts four other grids, each then started.

A = Llama-8B shape, 128 seqs, 4,096 batched tokens, utilization 0.85, started with memest on and
its allocator history kept (reports/vllm/raw/call11, cold compile). The four grids G' change
max_num_seqs 4x (W1: 32), max_num_batched_tokens 2x (W2: 8,192), add EAGLE3 K=3 (W3) and cap
the capture sizes at 64 (W4); each was started on the same H200 with memest apply sizing its
KV cache (lab/vllm_runs.py --group whatif, and --group redo for W2, whose step call 11 could only
fill to 4,095 tokens).

For each G' this script runs ``memest estimate --from A --grid G' --json`` verbatim (the command
a user types; with --snapshot too, the allocator replay) and compares:
- the predicted KV budget with the KV that fills G''s budget exactly in its real start: measured
  KV bytes minus measured usage - budget, usage read at serving's first full-size step;
- the predicted graph pool per capture stage with what G''s start measured (its report).

    python lab/whatif_grids.py            # print the table
    python lab/whatif_grids.py --write    # also reports/vllm/whatif.json
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "reports" / "vllm" / "raw"
OUT = ROOT / "reports" / "vllm" / "whatif.json"
G = "call11.A_llama8b_s128_t4096.enable-cold"
DRAFTER = "examples/eagle3_8b.config.json"
# G' -> (the grid as a user writes it, the real start's raw name, its results file)
GRIDS: dict[str, tuple[dict[str, Any], str, str]] = {
    "W1 max_num_seqs 128 -> 32": (
        {"max_num_seqs": 32},
        "call11.W1_llama8b_s32_t4096.apply",
        "results.call11.jsonl",
    ),
    "W2 max_num_batched_tokens 4096 -> 8192": (
        {"max_num_batched_tokens": 8192},
        "call14.W2_llama8b_s128_t8192.apply-cold",
        "results.call14.jsonl",
    ),
    "W3 EAGLE3 K=3 added": (
        {"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3}},
        "call11.W3_llama8b_eagle3k3_s128_t4096.apply",
        "results.call11.jsonl",
    ),
    "W4 capture sizes capped at 64": (
        {"compilation_config": {"max_cudagraph_capture_size": 64}},
        "call11.W4_llama8b_s128_t4096_cap64.apply",
        "results.call11.jsonl",
    ),
}
GIB = 1 << 30
KV_TOLERANCE = 0.1 * GIB
POOL_TOLERANCE = 0.05


def memest(args: list[str]) -> tuple[str, dict[str, Any]]:
    cmd = ["memest", *args]
    exe = Path(sys.executable).with_name("memest")
    proc = subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return shlex.join(cmd), json.loads(proc.stdout)


def start_record(results: str, run: str) -> dict[str, Any]:
    config, mode = run.split(".", 2)[1:]
    for line in (RAW / results).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("config") == config and rec.get("mode") == mode:
            return rec
    raise SystemExit(f"no record of {run} in {results}")


def exact_kv(rec: dict[str, Any]) -> int:
    """The KV that fills the budget exactly: measured KV minus measured usage - budget."""
    return int(rec["kv_bytes"]) - int(rec["step_usage_minus_budget_bytes"])


def stage_pools(owners: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in owners:
        if row["stage"] != "capture":  # graph objects live outside the pools
            out[row["stage"]] = out.get(row["stage"], 0) + int(row["predicted_bytes"])
    return out


def check(name: str, grid: dict[str, Any], run: str, results: str) -> dict[str, Any]:
    rec = start_record(results, run)
    report = f"reports/vllm/raw/{G}.report.rank0.json"
    snapshot = f"reports/vllm/raw/{G}.snapshot.rank0.json.gz"
    base = ["estimate", "--from", report, "--grid", json.dumps(grid), "--json"]
    if "speculative_config" in grid:
        base += ["--drafter-config", DRAFTER]
    cmd_laws, laws = memest(base)
    cmd_replay, replay = memest([*base, "--snapshot", snapshot])
    _, measured = memest(
        ["estimate", "--from", f"reports/vllm/raw/{run}.report.rank0.json", "--json"]
    )
    truth = exact_kv(rec)
    measured_pools = measured["accounting"]["graph_pool_by_stage_bytes"]
    row: dict[str, Any] = {
        "grid": grid,
        "real_start": run,
        "truth_kv_bytes": truth,
        "truth_from": "measured KV minus (usage - budget) at serving's first full-size step "
        f"({rec['step_tokens']} tokens in {rec.get('step_prompts', 1)} prompt(s))",
        "measured_graph_pool_by_stage_bytes": measured_pools,
        "predictions": {},
    }
    for label, cmd, out in (("laws", cmd_laws, laws), ("allocator replay", cmd_replay, replay)):
        w = out["what_if"]
        pools = stage_pools(w["owners"])
        pool_err = {
            st: (pools.get(st, 0) - b) / b if b else None for st, b in measured_pools.items()
        }
        row["predictions"][label] = {
            "command": cmd,
            "kv_budget_bytes": w["kv_budget_bytes_to"],
            "kv_error_bytes": w["kv_budget_bytes_to"] - truth,
            "kv_within_0.1_GiB": abs(w["kv_budget_bytes_to"] - truth) <= KV_TOLERANCE,
            "graph_pool_by_stage_bytes": pools,
            "graph_pool_relative_error": pool_err,
            "graph_pool_within_5_percent": all(
                e is not None and abs(e) <= POOL_TOLERANCE for e in pool_err.values()
            ),
            "kv_cache_memory_bytes_flag": out.get("kv_cache_memory_bytes_to"),
        }
    return row


def main() -> int:
    rows = {name: check(name, *spec) for name, spec in GRIDS.items()}
    print(f"From {G} (128 seqs, 4,096 batched tokens, utilization 0.85)\n")
    print("| G' | exact KV GiB | laws: KV GiB (error) | replay: KV GiB (error) | pools per stage |")
    print("|---|---:|---:|---:|---|")
    for name, r in rows.items():
        cells = []
        for label in ("laws", "allocator replay"):
            p = r["predictions"][label]
            cells.append(f"{p['kv_budget_bytes'] / GIB:.3f} ({p['kv_error_bytes'] / GIB:+.3f})")
        pools = "; ".join(
            f"{st} {b / (1 << 20):.0f} MiB measured, "
            f"laws {r['predictions']['laws']['graph_pool_by_stage_bytes'].get(st, 0) / (1 << 20):.0f}, "
            f"replay {r['predictions']['allocator replay']['graph_pool_by_stage_bytes'].get(st, 0) / (1 << 20):.0f}"
            for st, b in r["measured_graph_pool_by_stage_bytes"].items()
        )
        print(f"| {name} | {r['truth_kv_bytes'] / GIB:.3f} | {cells[0]} | {cells[1]} | {pools} |")
    if "--write" in sys.argv:
        OUT.write_text(
            json.dumps(
                {
                    "from": G,
                    "command": "python lab/whatif_grids.py --write",
                    "device_runs": [
                        "lab/vllm_runs.py --group whatif (call 11)",
                        "lab/vllm_runs.py --group redo (call 14: W2)",
                    ],
                    "grids": rows,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""What-if on the real H200 starts: predict B's capture pool from A and A's from B, both laws.

A = Llama-8B shape, max_num_seqs 128, max_num_batched_tokens 4096 (widest PIECEWISE 256 tokens);
B = the same model at 32 / 2048 (widest 64 tokens). For each direction G -> G' the script predicts
each (stage, owner)'s capture-pool growth under G' (G' = the other start's vLLM 0.33.0 capture
plan) from G's report with the linear laws, and from G's report and snapshot with the allocator
replay, and compares both with what G' measured (its own snapshot's trigger table). A third
column is the what-if without a snapshot given the model's shape (the committed Llama-8B
config.json): each stage measured at G + synthetic(G') - synthetic(G), the synthetic per-graph
request trace's difference (memest.estimate.whatif_synthetic).

Owners are charged from the snapshots with today's owner rules on both sides (the committed A
report predates the compiled_piece rule), so the linear law's measured rows are the same as the
replay's.

    PYTHONPATH=. .venv/bin/python lab/whatif_real.py    # writes reports/vllm/whatif_pools.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from whatif_tools import grid_changes

from memest.analysis.replay import analyze
from memest.estimate.poolreplay import pool_trace, replay
from memest.estimate.whatif import measured_plan, pool_predictions
from memest.schema import Breakdown, RunReport
from memest.snapshot import Snapshot, load_snapshot

HERE = Path(__file__).resolve().parents[1] / "reports" / "vllm"
RAW = HERE / "raw"
RUNS = {
    "A": "call3.A_llama8b_s128_t4096.enable",
    "B": "call4.B_llama8b_s32_t2048.enable",
}
PHASE = "capture"  # graph_profiling captures into a throwaway pool


def _load(name: str) -> tuple[RunReport, Snapshot]:
    stem = RAW / RUNS[name]
    report = RunReport.model_validate_json(Path(f"{stem}.report.rank0.json").read_text())
    return report, load_snapshot(f"{stem}.snapshot.rank0.json.gz")


def _measured(snapshot: Snapshot) -> tuple[Breakdown, dict[tuple[str, str], int]]:
    bd = analyze(snapshot)
    rows: dict[tuple[str, str], int] = {}
    for t in bd.triggers:
        if t.phase == PHASE:
            rows[(t.stage, t.owner)] = rows.get((t.stage, t.owner), 0) + t.bytes
    return bd, rows


def _synthetic(report: RunReport, grid: Any) -> dict[tuple[str, str], int]:
    """Pool rows of the what-if without a snapshot, given the model's shape: each stage measured
    at G + synthetic(G') - synthetic(G) (memest.estimate.whatif_synthetic)."""
    rows, _ = pool_predictions(report, grid, dims=model_dims(report))
    return {(p.stage, p.owner): p.predicted_bytes for p in rows}


def _error_pct(predicted: int, measured: int) -> float | None:
    return round(100 * (predicted - measured) / measured, 2) if measured else None


def main() -> None:
    runs = {name: _load(name) for name in RUNS}
    measured = {name: _measured(snap) for name, (_, snap) in runs.items()}
    records: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    for g, g2 in (("A", "B"), ("B", "A")):
        report, snapshot = runs[g]
        # The linear law on the same measured rows as the replay (see the module docstring).
        fresh = report.model_copy(update={"breakdown": measured[g][0]})
        grid = measured_plan(runs[g2][0])
        linear, _ = pool_predictions(fresh, grid)
        start = time.perf_counter()
        replayed, notes = pool_predictions(fresh, grid, snapshot=snapshot, snapshot_source=RUNS[g])
        timings[f"{g}->{g2}"] = round(time.perf_counter() - start, 3)
        if notes:
            raise SystemExit(f"{g}->{g2}: {notes}")
        lin = {(p.stage, p.owner): p for p in linear}
        rep = {(p.stage, p.owner): p for p in replayed}
        syn = _synthetic(fresh, grid)
        truth = measured[g2][1]
        for key in sorted(set(rep) | set(truth)):
            p = rep.get(key)
            row = {
                "direction": f"{g}->{g2}",
                "stage": key[0],
                "owner": key[1],
                "measured_g_bytes": measured[g][1].get(key, 0),
                "linear_law": lin[key].law if key in lin else "",
                "predicted_linear_bytes": lin[key].predicted_bytes if key in lin else 0,
                "predicted_replay_bytes": p.predicted_bytes if p is not None else 0,
                "predicted_synthetic_bytes": syn.get(key, 0),
                "measured_g2_bytes": truth.get(key, 0),
            }
            row["error_linear_pct"] = _error_pct(row["predicted_linear_bytes"], truth.get(key, 0))
            row["error_replay_pct"] = _error_pct(row["predicted_replay_bytes"], truth.get(key, 0))
            row["error_synthetic_pct"] = _error_pct(
                row["predicted_synthetic_bytes"], truth.get(key, 0)
            )
            records.append(row)
    fidelity = [_fidelity(name, rep, snap) for name, (rep, snap) in runs.items()]
    budget = _budget_records()
    out = {
        "records": records,
        "fidelity": fidelity,
        "replay_seconds": timings,
        "non_kv_records": budget,
    }
    (HERE / "whatif_pools.json").write_text(json.dumps(out, indent=2) + "\n")
    _print(records, fidelity)
    print(  # noqa: T201
        "\nnon-KV memory under G' (what-if from G's apply start, call 6) vs the G' start's own"
    )
    for r in budget:
        print(  # noqa: T201
            f"{r['direction']} activation {r['predicted_activation_bytes'] / 2**20:.1f} MiB "
            f"(measured {r['measured_activation_bytes'] / 2**20:.1f}, "
            f"{r['error_activation_pct']:+.1f} %); non-KV {r['predicted_non_kv_bytes'] / 2**30:.3f} "
            f"GiB (measured {r['measured_non_kv_bytes'] / 2**30:.3f}, "
            f"{r['error_non_kv_pct']:+.2f} %)"
        )


# Apply starts of call 6: both carry the warm profile pass (phase profile_run.warm).
BUDGET_RUNS = {"B": "B_llama8b_s32_t2048", "D": "D_llama8b_s128_t4096_u070"}


def _budget_records() -> list[dict[str, Any]]:
    """The what-if's non-KV memory under G' against what the G' start measured at its first
    full-size step (usage minus KV bytes). B and D differ in max_num_seqs, max_num_batched_tokens
    and utilization; utilization moves the budget, not the non-KV memory, so that is compared."""
    from memest.estimate import full_init_terms, what_if

    reports = {
        k: RunReport.model_validate_json((RAW / f"call6.{v}.apply.report.rank0.json").read_text())
        for k, v in BUDGET_RUNS.items()
    }
    starts = {}
    for line in (RAW / "results.call6.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("mode") == "apply":
            starts[rec["config"]] = rec
    out = []
    for g, g2 in (("B", "D"), ("D", "B")):
        result = what_if(
            reports[g],
            grid_changes(reports[g2].config, capture_sizes=True),
            dims=model_dims(reports[g]),
        )
        assert result.terms_to is not None and result.kv_budget_bytes_to is not None
        predicted = result.terms_to.requested_bytes - result.kv_budget_bytes_to
        start = starts[BUDGET_RUNS[g2]]
        measured_non_kv = start["step_usage_bytes"] - start["kv_bytes"]
        act = next((n for n in result.notes if n.startswith("activation headroom")), "")
        act_to = int(act.split("-> ")[1].split(" B")[0]) if act else 0
        act_measured = full_init_terms(reports[g2]).profile_peak_activation_bytes
        out.append(
            {
                "direction": f"{g}->{g2}",
                "predicted_non_kv_bytes": predicted,
                "measured_non_kv_bytes": measured_non_kv,
                "error_non_kv_pct": _error_pct(predicted, measured_non_kv),
                "predicted_activation_bytes": act_to,
                "measured_activation_bytes": act_measured,
                "error_activation_pct": _error_pct(act_to, act_measured),
            }
        )
    return out


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def model_dims(report: RunReport) -> Any:
    """The model's dimensions: recorded in the report by the plugin (starts from now on), else
    the committed config.json files of the Llama-8B shape and its EAGLE3 drafter (older starts).
    The 4-grid real-vLLM check (one start per model, four other grids) passes these to every
    what-if, so the grid-sized runner buffers and the drafter's weights move."""
    from memest.estimate.runner_buffers import ModelDims

    recorded = ModelDims.from_report(report)
    if recorded is not None:
        return recorded
    target = json.loads((EXAMPLES / "llama8b.config.json").read_text())
    drafter = json.loads((EXAMPLES / "eagle3_8b.config.json").read_text())
    return ModelDims.from_report(report, target, drafter=drafter)


def _fidelity(name: str, report: RunReport, snapshot: Snapshot) -> dict[str, Any]:
    """Unscaled replay of the capture pool (grid G itself) against the snapshot's segments."""
    trace = pool_trace(snapshot, measured_plan(report), phase=PHASE)
    again = replay(trace, measured_plan(report))
    return {
        "run": name,
        "measured_bytes": sum(trace.measured.values()),
        "measured_segments": sum(trace.measured_segments.values()),
        "replayed_bytes": sum(again.bytes_by_owner.values()),
        "replayed_segments": sum(again.segments_by_stage.values()),
        "measured_by_owner": {f"{s}/{o}": b for (s, o), b in trace.measured.items()},
        "replayed_by_owner": {f"{s}/{o}": b for (s, o), b in again.bytes_by_owner.items()},
    }


def _pct(value: float | None) -> str:
    return f"{value:+.1f}" if value is not None else "-"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}"


def _print(records: list[dict[str, Any]], fidelity: list[dict[str, Any]]) -> None:
    out: list[str] = []
    for f in fidelity:
        out.append(
            f"fidelity {f['run']}: measured {f['measured_bytes']} B in {f['measured_segments']} "
            f"segments, replayed {f['replayed_bytes']} B in {f['replayed_segments']}"
        )
    out.append("")
    head = ("direction", "stage", "owner", "G MiB", "linear MiB", "replay MiB", "synthetic MiB",
            "G' MiB", "lin %", "replay %", "synthetic %")  # fmt: skip
    out.append(" | ".join(head))
    for r in records:
        out.append(
            " | ".join(
                (
                    r["direction"],
                    r["stage"],
                    r["owner"],
                    _mib(r["measured_g_bytes"]),
                    _mib(r["predicted_linear_bytes"]),
                    _mib(r["predicted_replay_bytes"]),
                    _mib(r["predicted_synthetic_bytes"]),
                    _mib(r["measured_g2_bytes"]),
                    _pct(r["error_linear_pct"]),
                    _pct(r["error_replay_pct"]),
                    _pct(r["error_synthetic_pct"]),
                )
            )
        )

    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

"""Break an allocator snapshot down by phase, capture stage and owner.

memest analyze SNAPSHOT [--phases FILE] [--rules FILE] [--json | --md] [--unit GiB|MiB]
memest analyze --run DIR [--rel-threshold F] [--abs-threshold SIZE] [--json]

SNAPSHOT is memest's JSON snapshot (as the recorder writes it), or torch's pickle from
torch.cuda.memory._dump_snapshot (read with a restricted unpickler: only builtin containers and
scalars; any other global is refused), either optionally gzip-compressed. It must be a regular
file of at most MEMEST_MAX_INPUT_BYTES (default 2GiB), decompressed content included. memest JSON
is read as a stream into compact columns: memory about the snapshot's own size.

--phases takes a JSON list of phase records, or a RunReport (its "phases"); without it the
snapshot's own phases are used. --rules adds owner rules from a JSON file
({"rules": [{"owner": ..., "function": glob, "file": glob}]}; "module" and "code" globs match
torch.compile'd code's FX nodes through the snapshot's compiled_code map) ahead of the vLLM
0.33.0 defaults.

--run DIR reads the per-rank reports of one run (DIR/report.rank<N>.json, as the vLLM plugin
writes them), puts each rank's figures side by side and flags a rank whose figure differs from the
median of all ranks by more than --rel-threshold (default 0.05) and, for byte figures, by more
than --abs-threshold (default 64MiB); missing ranks are flagged too. Exit 1 when a rank is
flagged, so a CI job can gate on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from memest.analysis import OwnerRules, analyze
from memest.analysis.ranks import (
    DEFAULT_REL_THRESHOLD,
    STAGE_FIGURE,
    RankAggregate,
    aggregate_ranks,
)
from memest.cli._reports import load_report
from memest.errors import CommandError, first_error
from memest.estimate.parallel import ParallelBytes, run_parallel_bytes
from memest.files import MAX_REPORT_BYTES, load_json_file
from memest.reporters.breakdown import render_markdown, render_text
from memest.reporters.table import Table, markdown_grid
from memest.schema.breakdown import PhaseRecord
from memest.snapshot import load_snapshot
from memest.units import fmt_gib, parse_bytes


def _load_phases(path: Path) -> list[PhaseRecord]:
    data = load_json_file(path, limit=MAX_REPORT_BYTES)  # a list, or a whole RunReport
    if isinstance(data, dict) and "phases" in data:
        data = data["phases"]
    if not isinstance(data, list):
        raise CommandError(f"{path}: expected a list of phase records or an object with 'phases'")
    records: list[PhaseRecord] = []
    for i, item in enumerate(data):
        try:
            records.append(PhaseRecord.model_validate(item))
        except ValidationError as exc:
            where, message, _ = first_error(exc)
            raise CommandError(f"{path}: phases[{i}].{where}: {message}") from None
    return records


def _load_rules(path: Path) -> OwnerRules:
    """User rules ahead of the defaults (as OwnerRules.from_file), read with bounded memory."""
    user = OwnerRules.from_data(load_json_file(path), source=str(path))
    return OwnerRules.default().extend(user)


class AnalyzeCommand:
    name = "analyze"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "snapshot", type=Path, nargs="?", help="snapshot file (memest JSON or torch pickle)"
        )
        parser.add_argument(
            "--run", type=Path, metavar="DIR", help="aggregate the report.rank<N>.json of one run"
        )
        parser.add_argument(
            "--rel-threshold",
            type=float,
            default=DEFAULT_REL_THRESHOLD,
            help="--run: relative difference from the rank median that flags a rank",
        )
        parser.add_argument(
            "--abs-threshold",
            default="64MiB",
            help="--run: byte difference a byte figure must also exceed to flag a rank",
        )
        parser.add_argument("--phases", type=Path, help="phase records (JSON list or RunReport)")
        parser.add_argument("--rules", type=Path, help="owner rules JSON, tried before defaults")
        fmt = parser.add_mutually_exclusive_group()
        fmt.add_argument("--json", action="store_true", help="print the Breakdown as JSON")
        fmt.add_argument("--md", action="store_true", help="print markdown tables")
        parser.add_argument("--unit", choices=("GiB", "MiB"), default="GiB", help="table unit")

    def run(self, args: argparse.Namespace) -> int:
        if args.run is not None:
            if args.snapshot is not None:
                raise CommandError("give a SNAPSHOT or --run DIR, not both")
            return _run_ranks(args)
        if args.snapshot is None:
            raise CommandError("a SNAPSHOT file or --run DIR is required")
        snapshot = load_snapshot(args.snapshot)
        phases = _load_phases(args.phases) if args.phases else None
        rules = _load_rules(args.rules) if args.rules else OwnerRules.default()
        breakdown = analyze(snapshot, phases, rules)
        if phases is None:
            phases = [PhaseRecord.model_validate(p) for p in snapshot.get("phases", [])]
        if args.json:
            sys.stdout.write(breakdown.model_dump_json(indent=2) + "\n")
        elif args.md:
            sys.stdout.write(render_markdown(breakdown, args.unit, phases))
        else:
            sys.stdout.write(render_text(breakdown, args.unit, phases))
        return 0


def _run_ranks(args: argparse.Namespace) -> int:
    folder: Path = args.run
    if not folder.is_dir():
        raise CommandError(f"--run {folder}: not a folder")
    paths = sorted(folder.glob("report.rank*.json"))
    if not paths:
        raise CommandError(f"--run {folder}: no report.rank<N>.json files")
    reports = [load_report(p) for p in paths]
    agg = aggregate_ranks(
        reports,
        rel_threshold=args.rel_threshold,
        abs_threshold_bytes=parse_bytes(args.abs_threshold, field="--abs-threshold"),
    )
    parallel = run_parallel_bytes(reports)
    if args.json:
        doc = {
            "run_id": agg.run_id,
            "world_size": agg.world_size,
            "ranks": agg.ranks,
            "missing_ranks": agg.missing_ranks,
            "consistent": agg.consistent,
            "binding_rank": agg.binding_rank,
            "figures": {k: {str(r): v for r, v in vals.items()} for k, vals in agg.figures.items()},
            "outliers": [o.describe() for o in agg.outliers],
            "hook_errors": {str(k): v for k, v in agg.hook_errors.items()},
        }
        if parallel is not None:
            doc["tp_outside_torch_bytes"] = parallel.outside_torch_bytes
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_ranks(agg, parallel))
    return 0 if agg.consistent else 1


#: How each per-rank figure (memest.analysis.ranks.FIGURES, --json keys) reads in the table.
FIGURE_LABELS = {
    "weights_bytes": "Weights, GiB",
    "graph_pool_growth_bytes": "Graph-pool growth, GiB",
    "capture_added_bytes": "Added during capture, GiB",
    "kv_blocks": "KV blocks",
    "available_kv_bytes": "KV memory vLLM made available, GiB",
    "used_end_bytes": "Device memory in use at the end of init, GiB",
    "vllm_cudagraph_logged_bytes": "vLLM's logged graph estimate, GiB",
}


def figure_label(name: str) -> str:
    """A per-rank figure as the table names it; a stage's pool growth names its stage."""
    if name.startswith(STAGE_FIGURE):
        return f"Pool growth of stage {name[len(STAGE_FIGURE) :]}, GiB"
    return FIGURE_LABELS.get(name, name)


def _cell(name: str, value: int) -> str:
    is_bytes = name.endswith("_bytes") or name.startswith(STAGE_FIGURE)
    return fmt_gib(value) if is_bytes else f"{value:,}"


def render_ranks(agg: RankAggregate, parallel: ParallelBytes | None = None) -> str:
    """The ranks of one run side by side, what TP adds outside PyTorch (TP > 1), then the flags."""
    lines = [f"run {agg.run_id}: ranks {agg.ranks} of world size {agg.world_size}", ""]
    header = ["Figure", *[f"rank {r}" for r in agg.ranks]]
    rows = [
        [figure_label(name), *[_cell(name, values[r]) if r in values else "" for r in agg.ranks]]
        for name, values in agg.figures.items()
    ]
    lines += markdown_grid(Table("", header, rows))
    lines.append("")
    if agg.binding_rank is not None and len(agg.ranks) > 1:
        lines.append(
            f"rank {agg.binding_rank} bound the KV cache (least KV memory available; vLLM sizes "
            "every rank's cache by it)"
        )
    if parallel is not None:
        lines.append(
            f"each rank holds {fmt_gib(parallel.outside_torch_bytes)} GiB outside PyTorch for "
            f"TP's communicators, derived ({parallel.describe()}; ± "
            f"{fmt_gib(parallel.uncertainty_bytes)} GiB): the binding rank's KV budget is "
            "after it"
        )
    if agg.missing_ranks:
        lines.append(f"FLAG missing ranks: {agg.missing_ranks}")
    for outlier in agg.outliers:
        lines.append(f"FLAG {outlier.describe()}")
    for rank, errors in sorted(agg.hook_errors.items()):
        lines.append(f"note rank {rank}: {len(errors)} hook error(s): {errors[0]}")
    if agg.consistent:
        lines.append("ranks agree within the thresholds")
    return "\n".join(lines) + "\n"


COMMAND = AnalyzeCommand()

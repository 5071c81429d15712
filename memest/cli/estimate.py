"""KV budget of one start: vLLM's estimate, memest's full-initialization one, the end state.

memest estimate --from REPORT.json [--grid JSON [--snapshot PATH]] [--margin SIZE] [--json]
                [--write-startup-plan DIR [--create-dir]]

REPORT.json is a RunReport (schema version 1) with the phases weights, profile_run,
kv_cache_alloc and capture or end, and its KV-cache spec. --grid predicts each owner's graph-pool
memory and the KV budget under another grid: a file or inline JSON holding a CapturePlan, or
memest.plan input fields ({"sizing": "vllm-0.33.0", "sm100": false, "max_num_seqs": 512, ...}).
--snapshot names the allocator snapshot of the same start: the what-if then replays its graph-pool
requests, resized for G', through a model of the caching allocator (pool growth is made of
segments, which linear laws miss by up to a segment per trigger).
--write-startup-plan writes vLLM 0.33.0's startup-plan file (VLLM_ENABLE_STARTUP_PLAN=1) into
DIR, which should be {VLLM_CACHE_ROOT}/startup_plan; the report must carry the worker's plan
fingerprint and free-memory baseline (estimate.startup_plan). DIR must exist unless --create-dir
is given (an unset $VLLM_CACHE_ROOT would otherwise write /startup_plan). The matching vLLM flag
is printed either way: --kv-cache-memory-bytes=N.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memest.cli._reports import load_report
from memest.errors import CommandError, ConfigError
from memest.estimate import (
    compare,
    record,
    startup_plan_document,
    what_if,
    write_startup_plan,
)
from memest.files import load_json_file, parse_json
from memest.reporters.estimate import render_comparison, render_what_if
from memest.snapshot import load_snapshot
from memest.units import parse_bytes


def load_grid(text: str) -> dict[str, Any]:
    """The --grid value: inline JSON (starting with '{') or a path to a JSON file."""
    if text.lstrip().startswith("{"):
        grid = parse_json(text.encode("utf-8", "surrogateescape"), source="--grid")
    else:
        grid = load_json_file(Path(text), error=lambda msg: CommandError(f"--grid {msg}"))
    if not isinstance(grid, dict):
        raise ConfigError("--grid", text, "expected a JSON object")
    return grid


def _check_plan_dir(directory: Path | None, *, create: bool) -> None:
    """Refuse a plan folder that does not exist unless asked to create it."""
    if directory is None:
        if create:
            raise ConfigError("--create-dir", True, "only used with --write-startup-plan")
        return
    if directory.is_dir() or create:
        return
    what = "is not a folder" if directory.exists() else "does not exist"
    raise CommandError(
        f"--write-startup-plan {directory}: {what} (is $VLLM_CACHE_ROOT set? "
        "pass --create-dir to create it)"
    )


class EstimateCommand:
    name = "estimate"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--from", dest="report", type=Path, required=True, help="RunReport JSON"
        )
        parser.add_argument("--grid", help="grid G' for a what-if (JSON file or inline JSON)")
        parser.add_argument(
            "--snapshot",
            type=Path,
            help="allocator snapshot of the same start: what-if by allocator replay (with --grid)",
        )
        parser.add_argument("--margin", default="0", help="memory kept free, e.g. 64MiB")
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument(
            "--write-startup-plan",
            type=Path,
            metavar="DIR",
            help="write vLLM's startup_plan_<fingerprint>.json into DIR (an existing folder)",
        )
        parser.add_argument(
            "--create-dir",
            action="store_true",
            help="with --write-startup-plan: create DIR when it does not exist",
        )

    def run(self, args: argparse.Namespace) -> int:
        _check_plan_dir(args.write_startup_plan, create=args.create_dir)
        report = load_report(args.report)
        margin = parse_bytes(args.margin, field="--margin")
        if margin < 0:
            raise ConfigError("--margin", args.margin, "must not be negative")
        if args.snapshot is not None and not args.grid:
            raise ConfigError("--snapshot", str(args.snapshot), "only used with --grid")
        comparison = compare(report, margin_bytes=margin)
        grid_result = None
        if args.grid:
            snapshot = load_snapshot(args.snapshot) if args.snapshot is not None else None
            grid_result = what_if(
                report,
                load_grid(args.grid),
                margin_bytes=margin,
                snapshot=snapshot,
                snapshot_source=str(args.snapshot),
            )
        memest = record(comparison, "memest")
        kv_bytes = memest.kv_cache_bytes if memest is not None else None
        plan_path: Path | None = None
        if args.write_startup_plan is not None:
            inputs = comparison.startup_plan
            if inputs is None:
                raise CommandError(
                    f"{args.report}: estimate.startup_plan (fingerprint, free-memory baseline) "
                    "is missing; only a running vLLM worker can compute them"
                )
            if not kv_bytes:
                raise CommandError(f"{args.report}: memest's KV budget is 0; no plan written")
            document = startup_plan_document(
                inputs.fingerprint, kv_bytes, inputs.free_memory_baseline_bytes
            )
            plan_path = write_startup_plan(args.write_startup_plan, document)
        if args.json:
            payload: dict[str, Any] = {"comparison": comparison.model_dump(mode="json")}
            if grid_result is not None:
                payload["what_if"] = grid_result.model_dump(mode="json")
            payload["kv_cache_memory_bytes"] = kv_bytes
            payload["startup_plan_path"] = str(plan_path) if plan_path else None
            sys.stdout.write(json.dumps(payload, indent=2) + "\n")
            return 0
        sys.stdout.write(render_comparison(comparison))
        if grid_result is not None:
            sys.stdout.write("\nWhat-if\n\n" + render_what_if(grid_result))
        if kv_bytes:
            sys.stdout.write(
                f"\nvLLM flag for memest's budget: --kv-cache-memory-bytes={kv_bytes}\n"
            )
        if plan_path is not None:
            sys.stdout.write(f"Startup plan written: {plan_path}\n")
        return 0


COMMAND = EstimateCommand()

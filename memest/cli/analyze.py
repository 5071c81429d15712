"""Break an allocator snapshot down by phase, capture stage and owner.

memest analyze SNAPSHOT [--phases FILE] [--rules FILE] [--json | --md] [--unit GiB|MiB]

SNAPSHOT is memest's JSON snapshot (as the recorder writes it), or torch's pickle from
torch.cuda.memory._dump_snapshot (read with a restricted unpickler: only builtin containers and
scalars; any other global is refused), either optionally gzip-compressed.

--phases takes a JSON list of phase records, or a RunReport (its "phases"); without it the
snapshot's own phases are used. --rules adds owner rules from a JSON file
({"rules": [{"owner": ..., "function": glob, "file": glob}]}) ahead of the vLLM 0.33.0 defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from memest.analysis import OwnerRules, analyze
from memest.errors import CommandError
from memest.reporters.breakdown import render_markdown, render_text
from memest.schema.breakdown import PhaseRecord
from memest.snapshot import load_snapshot


def _load_phases(path: Path) -> list[PhaseRecord]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CommandError(f"{path}: invalid JSON at line {exc.lineno}") from None
    if isinstance(data, dict) and "phases" in data:
        data = data["phases"]
    if not isinstance(data, list):
        raise CommandError(f"{path}: expected a list of phase records or an object with 'phases'")
    records: list[PhaseRecord] = []
    for i, item in enumerate(data):
        try:
            records.append(PhaseRecord.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise CommandError(f"{path}: phases[{i}].{where}: {first['msg']}") from None
    return records


class AnalyzeCommand:
    name = "analyze"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "snapshot", type=Path, help="snapshot file (memest JSON or torch pickle)"
        )
        parser.add_argument("--phases", type=Path, help="phase records (JSON list or RunReport)")
        parser.add_argument("--rules", type=Path, help="owner rules JSON, tried before defaults")
        fmt = parser.add_mutually_exclusive_group()
        fmt.add_argument("--json", action="store_true", help="print the Breakdown as JSON")
        fmt.add_argument("--md", action="store_true", help="print markdown tables")
        parser.add_argument("--unit", choices=("GiB", "MiB"), default="GiB", help="table unit")

    def run(self, args: argparse.Namespace) -> int:
        snapshot = load_snapshot(args.snapshot)
        phases = _load_phases(args.phases) if args.phases else None
        rules = OwnerRules.from_file(args.rules) if args.rules else OwnerRules.default()
        breakdown = analyze(snapshot, phases, rules)
        if args.json:
            sys.stdout.write(breakdown.model_dump_json(indent=2) + "\n")
        elif args.md:
            sys.stdout.write(render_markdown(breakdown, args.unit))
        else:
            sys.stdout.write(render_text(breakdown, args.unit))
        return 0


COMMAND = AnalyzeCommand()

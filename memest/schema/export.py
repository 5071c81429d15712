"""Export the JSON Schemas of RunReport and of pre-flight to memest/schema/json/ (a test fails when a
file is stale). They ship in the wheel as package data; reports/schema/ links to that folder."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memest.schema.preflight import PreflightRequest, PreflightResult
from memest.schema.report import RunReport

SCHEMA_FILE = Path("memest/schema/json/run-report.v1.json")
PREFLIGHT_SCHEMA_FILE = Path("memest/schema/json/preflight.v1.json")


def render() -> str:
    schema = RunReport.model_json_schema()
    schema["$id"] = "https://memest.dev/schema/run-report.v1.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def render_preflight() -> str:
    """The pre-flight request and result (memest preflight --json, POST /api/v1/preflight)."""
    request = PreflightRequest.model_json_schema(ref_template="#/$defs/{model}")
    result = PreflightResult.model_json_schema(ref_template="#/$defs/{model}")
    defs = {**request.pop("$defs", {}), **result.pop("$defs", {})}
    defs["PreflightRequest"], defs["PreflightResult"] = request, result
    schema = {
        "$id": "https://memest.dev/schema/preflight.v1.json",
        "title": "memest pre-flight",
        "oneOf": [{"$ref": "#/$defs/PreflightRequest"}, {"$ref": "#/$defs/PreflightResult"}],
        "$defs": defs,
    }
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memest.schema.export",
        description="Write the run-report JSON Schema (and the pre-flight's beside it).",
    )
    parser.add_argument("target", nargs="?", type=Path, default=SCHEMA_FILE, help="%(default)s")
    target = parser.parse_args(argv).target
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render())
    (target.parent / PREFLIGHT_SCHEMA_FILE.name).write_text(render_preflight())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

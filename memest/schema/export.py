"""Export the JSON Schema of RunReport to reports/schema/ (a test fails when the file is stale)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memest.schema.report import RunReport

SCHEMA_FILE = Path("reports/schema/run-report.v1.json")


def render() -> str:
    schema = RunReport.model_json_schema()
    schema["$id"] = "https://memest.dev/schema/run-report.v1.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    target = Path(argv[0]) if argv else SCHEMA_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Reading RunReport files for the CLI commands."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from memest.errors import ReportFormatError
from memest.schema import SCHEMA_VERSION, RunReport


def load_report(path: Path) -> RunReport:
    """Read one RunReport JSON file.

    Raises:
        ReportFormatError: unreadable, not JSON, another schema version, or an invalid field
            (the first failing field is named).
    """
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ReportFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportFormatError(f"{path}: invalid JSON at line {exc.lineno}") from None
    if not isinstance(data, dict):
        raise ReportFormatError(f"{path}: expected a RunReport JSON object")
    version = data.get("schema_version", SCHEMA_VERSION)  # absent: the model default
    if version != SCHEMA_VERSION:
        raise ReportFormatError(
            f"{path}: schema_version {version!r}, memest reads {SCHEMA_VERSION!r}"
        )
    try:
        return RunReport.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ReportFormatError(f"{path}: field {where}: {first['msg']}") from None


def report_files(paths: list[Path]) -> list[Path]:
    """Expand folders into their ``*.json`` files (sorted); files pass through."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.json") if q.is_file()))
        else:
            out.append(p)
    return out

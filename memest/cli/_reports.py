"""Reading RunReport files for the CLI commands."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from memest.errors import ReportFormatError
from memest.files import MAX_REPORT_BYTES, load_json_file
from memest.schema import SCHEMA_VERSION, RunReport


def load_report(path: Path) -> RunReport:
    """Read one RunReport JSON file.

    Raises:
        ReportFormatError: unreadable, not a regular file, over MAX_REPORT_BYTES, not UTF-8
            JSON, another schema version, or an invalid field (the first failing one is named).
    """
    data = load_json_file(path, limit=MAX_REPORT_BYTES, error=ReportFormatError)
    if not isinstance(data, dict):
        raise ReportFormatError(f"{path}: expected a RunReport JSON object")
    version = data.get("schema_version", SCHEMA_VERSION)  # absent: the model default
    if version != SCHEMA_VERSION:
        raise ReportFormatError(
            f"{path}: schema_version {str(version)[:20]!r}, memest reads {SCHEMA_VERSION!r}"
        )
    try:
        return RunReport.model_validate(data)
    except RecursionError:
        raise ReportFormatError(f"{path}: nested too deeply") from None
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

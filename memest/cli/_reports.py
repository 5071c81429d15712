"""Reading RunReport files for the report, check and push commands."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from memest.errors import ReportFormatError
from memest.schema import SCHEMA_VERSION, RunReport


def load_report(path: Path) -> RunReport:
    """Read one RunReport JSON file.

    Raises:
        ReportFormatError: unreadable, not JSON, another schema version, or an invalid field (named).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ReportFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return RunReport.model_validate_json(text)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0] if errors else None
        if first is not None and tuple(first["loc"]) == ("schema_version",):
            raise ReportFormatError(
                f"{path}: schema_version is not {SCHEMA_VERSION!r} ({first['msg']})"
            ) from None
        where = ".".join(str(p) for p in first["loc"]) if first else "?"
        what = first["msg"] if first else str(exc)
        raise ReportFormatError(f"{path}: {where}: {what}") from None


def report_files(paths: list[Path]) -> list[Path]:
    """Expand folders into their ``*.json`` files (sorted); files pass through."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.json") if q.is_file()))
        else:
            out.append(p)
    return out

"""Reading RunReport files for the CLI commands (the loaders live in the core)."""

from __future__ import annotations

from memest.delivery import report_files
from memest.files import load_report

__all__ = ["load_report", "report_files"]

"""ARCHITECTURE.md stays true to the tree: every path and module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "ARCHITECTURE.md").read_text()
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__"}


def _python_files() -> set[str]:
    return {p.name for p in ROOT.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)}


def test_every_backticked_path_exists() -> None:
    paths = {m for m in re.findall(r"`([\w./-]+)`", DOC) if "/" in m}
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    assert paths and missing == []


def test_every_folder_of_the_tree_drawing_exists() -> None:
    folders = set(re.findall(r"^\s{2}(\w+)/\s", DOC, flags=re.MULTILINE))
    assert {"schema", "plan", "estimate", "service"} <= folders
    missing = sorted(f for f in folders if not (ROOT / "memest" / f).is_dir())
    assert missing == []


def test_every_module_it_names_exists() -> None:
    named = set(re.findall(r"\b(\w+\.py)\b", DOC))
    assert named
    assert sorted(named - _python_files()) == []

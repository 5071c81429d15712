from __future__ import annotations

from pathlib import Path

from memest.schema.export import PREFLIGHT_SCHEMA_FILE, SCHEMA_FILE, render, render_preflight

ROOT = Path(__file__).resolve().parents[2]


def test_committed_json_schema_is_current() -> None:
    committed = (ROOT / SCHEMA_FILE).read_text()
    assert committed == render(), "run `python -m memest.schema.export` and commit the result"


def test_committed_preflight_schema_is_current() -> None:
    committed = (ROOT / PREFLIGHT_SCHEMA_FILE).read_text()
    assert committed == render_preflight(), "run `python -m memest.schema.export` and commit it"

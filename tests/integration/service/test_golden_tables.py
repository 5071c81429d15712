"""Every table surface prints exactly what it printed before: the golden outputs under
tests/data/golden_tables (tests/golden_tables.py renders them and says how to regenerate, with
the reason). A change detector: it proves the output did not change, not that it is right."""

from __future__ import annotations

import difflib
from pathlib import Path

from tests.golden_tables import GOLDEN, outputs


def _first_difference(rel: str, expected: str, got: str) -> str:
    diff = difflib.unified_diff(
        expected.splitlines(), got.splitlines(), f"golden/{rel}", f"now/{rel}", lineterm=""
    )
    return "\n".join(list(diff)[:40])


def test_every_surface_prints_its_golden_output(tmp_path: Path) -> None:
    produced = outputs(tmp_path)
    stored = {p.relative_to(GOLDEN).as_posix() for p in GOLDEN.rglob("*") if p.is_file()}
    assert stored == set(produced), (
        f"missing: {sorted(set(produced) - stored)}; gone: {sorted(stored - set(produced))}"
    )
    changed = [rel for rel in sorted(produced) if (GOLDEN / rel).read_text() != produced[rel]]
    assert not changed, f"{len(changed)} outputs changed: {changed[:10]}\n" + _first_difference(
        changed[0], (GOLDEN / changed[0]).read_text(), produced[changed[0]]
    )

"""Golden outputs: what a surface printed at a fixed commit, compared byte for byte.

A test hands :func:`check` the name and the text a surface prints now; the text must equal
``tests/data/golden/<name>``. ``MEMEST_WRITE_GOLDEN=1`` writes the files instead (only when the
outputs are meant to change, and the diff reviewed).
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


def check(name: str, text: str) -> None:
    """Fail unless ``text`` is the stored golden output ``name``."""
    path = GOLDEN / name
    if os.environ.get("MEMEST_WRITE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"{path} missing: run once with MEMEST_WRITE_GOLDEN=1"
    stored = path.read_text()
    if text != stored:
        got, want = text.splitlines(), stored.splitlines()
        first = next(
            (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
            min(len(got), len(want)),
        )
        show_got = got[first] if first < len(got) else "<end>"
        show_want = want[first] if first < len(want) else "<end>"
        raise AssertionError(
            f"{name}: output changed at line {first + 1}:\n  now:    {show_got}\n  golden: {show_want}"
        )

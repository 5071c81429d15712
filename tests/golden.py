"""Golden outputs: a labelled change detector, not a statement of truth.

A golden file holds what a surface printed at the commit that wrote it. A test that compares
with one proves only that the output did not change; whether a figure is right is stated by
the tests that derive it by hand or compare it with a measured start.

A test hands :func:`check` the name and the text a surface prints now; the text must equal
``tests/data/golden/<name>``. To change the files on purpose, run the tests with the reason:

    MEMEST_WRITE_GOLDEN='why the output changes' pytest tests/integration/test_golden_*.py ...

Every file whose text changes is rewritten and listed under that reason in
``tests/data/golden/CHANGES.md`` (commit it with the files: the reason is the review's first
line). ``MEMEST_WRITE_GOLDEN=1`` or any reason shorter than :data:`MIN_REASON` is refused.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "golden"
CHANGES = GOLDEN / "CHANGES.md"
#: The shortest reason accepted: a few words, not a flag value.
MIN_REASON = 12
_HEADER = (
    "# Why the golden outputs changed\n\n"
    "Each section is one regeneration (MEMEST_WRITE_GOLDEN='<reason>', see tests/golden.py):\n"
    "the reason given, then every file under tests/data whose text it changed.\n"
)


def write_reason() -> str | None:
    """The reason golden files are being rewritten, or None when they are compared.

    Raises:
        AssertionError: MEMEST_WRITE_GOLDEN is set without a reason (``1``, a word or two).
    """
    reason = os.environ.get("MEMEST_WRITE_GOLDEN")
    if reason is None or reason == "":
        return None
    reason = " ".join(reason.split())
    if len(reason) < MIN_REASON:
        raise AssertionError(
            f"MEMEST_WRITE_GOLDEN={reason!r}: give the reason the outputs change "
            f"(at least {MIN_REASON} characters); it goes into {CHANGES.relative_to(DATA.parent)}"
        )
    return reason


def record_changes(reason: str, paths: Iterable[Path]) -> None:
    """List ``paths`` under ``reason`` in CHANGES.md (one section per reason, locked append)."""
    names = sorted(p.resolve().relative_to(DATA).as_posix() for p in paths)
    if not names:
        return
    CHANGES.parent.mkdir(parents=True, exist_ok=True)
    with CHANGES.open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # pytest-xdist workers write at once
        fh.seek(0)
        text = fh.read() or _HEADER
        heading = f"\n## {reason}\n\n"
        if heading not in text:
            text += heading
        start = text.rindex(heading) + len(heading)
        end = text.find("\n## ", start)
        end = len(text) if end < 0 else end
        listed = set(text[start:end].splitlines())
        added = "".join(f"- {n}\n" for n in names if f"- {n}" not in listed)
        text = text[:end] + added + text[end:]
        fh.seek(0)
        fh.truncate()
        fh.write(text)


def write(path: Path, text: str, reason: str) -> None:
    """Write a golden file; list it in CHANGES.md when its text changed."""
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    record_changes(reason, [path])


def check(name: str, text: str) -> None:
    """Fail unless ``text`` is the stored golden output ``name`` (it detects change only)."""
    path = GOLDEN / name
    reason = write_reason()
    if reason is not None:
        write(path, text, reason)
        return
    assert path.is_file(), f"{path} missing: run with MEMEST_WRITE_GOLDEN='<why it is new>'"
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
            f"{name}: output changed at line {first + 1} (a change, not necessarily an error; "
            f"if intended, rerun with MEMEST_WRITE_GOLDEN='<why>'):\n"
            f"  now:    {show_got}\n  golden: {show_want}"
        )

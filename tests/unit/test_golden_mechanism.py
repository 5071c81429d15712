"""The golden files' change detector: a rewrite needs a reason, and the reason is recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import golden


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(golden, "DATA", tmp_path)
    monkeypatch.setattr(golden, "GOLDEN", tmp_path / "golden")
    monkeypatch.setattr(golden, "CHANGES", tmp_path / "golden" / "CHANGES.md")
    return tmp_path


def test_a_changed_output_fails_and_names_the_line(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEMEST_WRITE_GOLDEN", raising=False)
    (data / "golden").mkdir()
    (data / "golden" / "a.txt").write_text("one\ntwo\n")
    golden.check("a.txt", "one\ntwo\n")
    with pytest.raises(AssertionError, match="line 2"):
        golden.check("a.txt", "one\nthree\n")


@pytest.mark.parametrize("value", ["1", "yes", "  fix  "])
def test_a_rewrite_without_a_reason_is_refused(
    data: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("MEMEST_WRITE_GOLDEN", value)
    with pytest.raises(AssertionError, match="give the reason"):
        golden.check("a.txt", "text\n")
    assert not (data / "golden" / "a.txt").exists()


def test_a_rewrite_lists_each_changed_file_once_under_its_reason(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (data / "golden").mkdir()
    (data / "golden" / "same.txt").write_text("kept\n")
    monkeypatch.setenv("MEMEST_WRITE_GOLDEN", "activation term gains the sampler reserve")
    golden.check("same.txt", "kept\n")
    golden.check("x/new.txt", "new\n")
    golden.check("x/new.txt", "newer\n")
    monkeypatch.setenv("MEMEST_WRITE_GOLDEN", "utilization default 0.92")
    golden.check("same.txt", "changed\n")
    changes = (data / "golden" / "CHANGES.md").read_text()
    assert (data / "golden" / "x/new.txt").read_text() == "newer\n"
    first = changes.index("## activation term gains the sampler reserve\n\n- golden/x/new.txt\n")
    second = changes.index("## utilization default 0.92\n\n- golden/same.txt\n")
    assert first < second
    assert changes.count("golden/x/new.txt") == 1 and changes.count("golden/same.txt") == 1

"""The token `memest serve` prints must paste into `memest push --token <value>` as is."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest

from memest.cli.serve import _write_token, new_write_token
from memest.errors import CommandError


def test_generated_tokens_parse_as_the_value_of_token() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token")
    for _ in range(2000):
        token = new_write_token()
        assert not token.startswith("-")
        assert parser.parse_args(["--token", token]).token == token


def test_generated_tokens_are_long_and_distinct() -> None:
    tokens = {new_write_token() for _ in range(200)}
    assert len(tokens) == 200
    assert all(len(t) >= 32 for t in tokens)


def test_token_file_is_made_once_then_read_back_and_never_printed(tmp_path: Path) -> None:
    path = tmp_path / "write-token"
    token, note = _write_token(str(path))
    assert note == f"write token (MEMEST_WRITE_TOKEN was unset): made and saved to {path}"
    assert token not in note
    assert path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, note_again = _write_token(str(path))  # a restart
    assert (again, note_again) == (token, None)


def test_without_a_token_file_the_new_token_is_printed() -> None:
    token, note = _write_token(None)
    assert note == f"write token (MEMEST_WRITE_TOKEN was unset): {token}"


@pytest.mark.parametrize(
    ("setup", "message"),
    [("empty", "the file is empty"), ("no-folder", "No such file or directory")],
)
def test_unusable_token_file_is_one_line(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "write-token"
    if setup == "empty":
        path.write_text("\n")
    else:
        path = tmp_path / "missing" / "write-token"
    with pytest.raises(CommandError, match=f"^--write-token-file {path}: {message}$"):
        _write_token(str(path))

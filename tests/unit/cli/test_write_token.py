"""The token `memest serve` prints must paste into `memest push --token <value>` as is."""

from __future__ import annotations

import argparse

from memest.cli.serve import new_write_token


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

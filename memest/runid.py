"""The run-id name rule, shared by the vLLM plugin's settings and anything else that takes a run
id from a user. Light on purpose (no pydantic): the plugin reads its settings at registration."""

from __future__ import annotations

import re

from memest.errors import ConfigError

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A run id that is safe as a folder name: letters, digits, ``.``, ``_`` and ``-``, starting with
a letter or digit (so never ``.`` or ``..``), at most 128 characters."""


def check_run_id(run_id: str, *, field: str = "MEMEST_RUN_ID") -> str:
    """``run_id`` when it matches RUN_ID_PATTERN, so a folder named by it stays inside its parent.

    Raises:
        ConfigError: naming ``field``: a path separator, ``..`` first, a space or another
            character outside the pattern, or more than 128 characters.
    """
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise ConfigError(
            field,
            run_id,
            "expected 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return run_id

"""README documents every CLI command and every MEMEST_* setting (plugin and service)."""

from __future__ import annotations

from pathlib import Path

import pytest
from memest_instrumentation.vllm.env import ENV_VARS

from memest.cli import _commands

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("name", [c.name for c in _commands()])
def test_every_command_is_in_the_readme(name: str) -> None:
    assert f"memest {name}" in README


@pytest.mark.parametrize("name", [v.name for v in ENV_VARS])
def test_every_plugin_setting_is_in_the_readme(name: str) -> None:
    assert f"`{name}`" in README


def test_every_service_setting_is_in_the_readme() -> None:
    from memest.service.config import Settings

    missing = [n for n in Settings.model_fields if f"`MEMEST_{n.upper()}`" not in README]
    assert missing == []

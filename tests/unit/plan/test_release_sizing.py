"""Which capture sizing each vLLM release runs (memest.plan.SIZING_BY_VERSION), and --vllm-version."""

from __future__ import annotations

import json

import pytest

from memest.cli import main
from memest.errors import ConfigError
from memest.plan import SIZING_BY_VERSION, SIZINGS, release_sizing
from memest.vllm_versions import SUPPORTED


def test_every_supported_release_has_a_sizing_row() -> None:
    assert set(SIZING_BY_VERSION) == set(SUPPORTED)
    assert set(SIZING_BY_VERSION.values()) <= set(SIZINGS)
    assert release_sizing("0.33.0") == "vllm-0.33.0"
    with pytest.raises(ConfigError, match="vllm_version='0.35.0'"):
        release_sizing("0.35.0")


def test_the_plan_names_the_sizing_the_release_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "h200", "--vllm-version", "0.34.0"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "vLLM 0.34.0 runs the seed sizing below"
    assert main(["plan", "--gpu", "h200", "--vllm-version", "0.33.0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["vllm_version"], doc["vllm_sizing"]) == ("0.33.0", "vllm-0.33.0")


def test_an_unsupported_release_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--vllm-version", "0.32.0"]) == 2
    assert "vllm_version='0.32.0'" in capsys.readouterr().err

"""The plugin's report names the model, the build and the configuration's fingerprint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fake_start
import pytest

from memest.identity import config_fingerprint
from memest.schema import RunReport


def test_report_carries_model_build_label_and_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_start.sized_start(monkeypatch, "plan")
    path = Path(os.environ["MEMEST_OUTPUT_DIR"]) / "sized-plan" / "report.rank0.json"
    report = RunReport.model_validate(json.loads(path.read_text()))
    assert report.model == "fake-llama"  # the served name of the fake start
    assert report.build.memest_version and report.build.label.endswith(
        f"memest-{report.build.memest_version}"
    )
    assert report.config_fingerprint is not None
    other = report.config.model_copy(update={"max_num_seqs": 8})
    assert report.config_fingerprint == config_fingerprint(report.config)
    assert report.config_fingerprint != config_fingerprint(other)

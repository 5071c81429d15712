"""POST /api/v1/preflight answers as `memest preflight` does; bad input is a 422 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.preflight.test_cli_api import GRID, LLAMA, _run

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from memest.service.app import create_app  # noqa: E402
from memest.service.config import Settings  # noqa: E402


def test_api_answers_as_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, out, _ = _run(capsys, "--model-config", str(LLAMA), *GRID, "--json")
    cli = json.loads(out)
    app = create_app(
        Settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", write_token="preflight-write-token")
    )
    body = {
        "model_config": json.loads(LLAMA.read_text()),
        "max_num_seqs": 128,
        "max_num_batched_tokens": 4096,
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.85,
    }
    with TestClient(app) as client:
        r = client.post("/api/v1/preflight", json=body)
        assert r.status_code == 200, r.text
        assert r.json() == cli
        bad = {**body, "model_config": {"num_attention_heads": 8}}
        r = client.post("/api/v1/preflight", json=bad)
        assert r.status_code == 422 and "hidden_size" in r.text
        r = client.post("/api/v1/preflight", json={**body, "gpu": "a100"})
        assert r.status_code == 422 and "a100" in r.text
        r = client.post("/api/v1/preflight", json={**body, "max_num_seqs": 0})
        assert r.status_code == 422 and "max_num_seqs" in r.text


def test_api_does_not_fit_is_422(tmp_path: Path) -> None:
    app = create_app(
        Settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", write_token="preflight-write-token")
    )
    body = {"model_config": json.loads(LLAMA.read_text()), "gpu_memory_utilization": 0.05}
    with TestClient(app) as client:
        r = client.post("/api/v1/preflight", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("does not fit: non-KV ")
        assert r.json()["field"] == "gpu_memory_utilization"
        r = client.post(
            "/api/v1/preflight",
            json={
                **body,
                "gpu_memory_utilization": 0.9,
                "max_num_seqs": 9999,
                "max_num_batched_tokens": 4096,
            },
        )
        assert r.status_code == 422 and r.json()["field"] == "max_num_seqs"

"""A report whose model is a local path (written before the plugin named models by their served
name) is stored and shown under the folder's name; the stored report keeps the original."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from tests.integration.service.conftest import AUTH, MakeClient

REPORT = (
    Path(__file__).parents[2]
    / "data/reports/call6.D_llama8b_s128_t4096_u070.apply.report.rank0.json"
)
PATH = "/work/main/.vllm_h200/models/llama8b"


def _post(client: TestClient, data: dict[str, Any]) -> None:
    r = client.post(
        "/api/v1/reports",
        content=json.dumps(data),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert r.status_code == 201, r.text


def test_a_path_model_is_stored_under_its_folder_name(make_client: MakeClient) -> None:
    data = json.loads(REPORT.read_text())
    assert data["model"] == data["config"]["model"] == PATH
    client = make_client()
    _post(client, data)

    assert [m["model"] for m in client.get("/api/v1/models").json()["data"]] == ["llama8b"]
    stored = client.get(f"/api/v1/reports/{data['report_id']}").json()
    assert stored["model"] == "llama8b"
    assert stored["config"]["model"] == PATH  # the original, kept in the stored report
    assert stored["notes"] == data["notes"]
    # The fingerprint is the configuration's, unchanged by the name.
    assert client.get(f"/api/v1/runs/{data['run_id']}").json()["facts"]["kv_tokens"] > 0

    page = client.get("/models/llama8b").text
    assert "<h1" in page and ">llama8b</h1>" in page
    # No page shows the local path, not even on hover (a title attribute names the model).
    assert 'title="llama8b"' in page
    for path in ("/models/llama8b", "/history/llama8b", "/"):
        shown = client.get(path)
        assert shown.status_code == 200 and PATH not in shown.text, path
    assert client.get(f"/models/{quote(PATH, safe='')}").status_code == 404


def test_an_original_name_without_config_copy_is_kept_in_a_note(make_client: MakeClient) -> None:
    data = json.loads(REPORT.read_text())
    data.update(report_id="path-model-r0", run_id="path-model", model="/srv/weights/Qwen3-8B/")
    client = make_client()
    _post(client, data)
    stored = client.get("/api/v1/reports/path-model-r0").json()
    assert stored["model"] == "Qwen3-8B"
    assert stored["notes"][-1] == "model as reported: /srv/weights/Qwen3-8B/"


def test_a_hugging_face_id_or_served_name_is_stored_as_sent(make_client: MakeClient) -> None:
    client = make_client()
    for i, name in enumerate(("meta-llama/Llama-3.1-8B-Instruct", "my-llama")):
        data = json.loads(REPORT.read_text())
        data.update(report_id=f"named-{i}-r0", run_id=f"named-{i}", model=name)
        _post(client, data)
        assert client.get(f"/api/v1/reports/named-{i}-r0").json()["model"] == name


def test_no_page_title_shows_a_windows_path(make_client: MakeClient) -> None:
    windows = "C:\\Users\\bob\\models\\phi-3"
    client = make_client()
    for i in range(2):
        data = json.loads(REPORT.read_text())
        data.update(report_id=f"win-{i}-r0", run_id=f"win-{i}", model=windows)
        data["config"]["model"] = windows
        _post(client, data)
    assert [m["model"] for m in client.get("/api/v1/models").json()["data"]] == ["phi-3"]
    for path in ("/", "/models/phi-3", "/history/phi-3", "/compare?a=win-0&b=win-1"):
        page = client.get(path)
        title = page.text.split("<title>", 1)[1].split("</title>", 1)[0]
        assert page.status_code == 200 and "Users" not in title, (path, title)
        assert "bob" not in page.text, path

"""The run page names the owners of torch.compile'd code in words, as it names eager owners."""

from __future__ import annotations

import html
from urllib.parse import quote

from fastapi.testclient import TestClient

from memest.identity import model_display_name
from tests.integration.service.conftest import AUTH
from tests.unit.reporters.test_compiled_owners import synthetic_report


def test_run_page_labels_compiled_owners(client: TestClient) -> None:
    # GIVEN a report whose breakdown charges generated code to owners through its map
    report = synthetic_report()
    posted = client.post(
        "/api/v1/reports",
        content=report.model_dump_json(),
        headers={"Content-Type": "application/json", **AUTH},
    )
    assert posted.status_code in (200, 201), posted.text
    # WHEN its run page is rendered
    model = model_display_name(report.model)  # a local path is stored under its folder name
    page = client.get(f"/models/{quote(model, safe='')}", params={"run": report.run_id})
    assert page.status_code == 200
    text = html.unescape(page.text)
    # THEN the owners read as words, and the unnamed one says why
    assert "QKV projection output" in text
    assert "compiled code — owner not named: no source node recorded" in text

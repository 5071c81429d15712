"""The compare page's long tables keep the rows that changed most (the total row too); the rest
are left to the comparison's JSON."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from memest.builds.compare import Delta
from memest.reporters.views import compare
from memest.schema import RunReport
from memest.service.routers.dashboard import PAGE_COMPARE_ROWS, _capped_rows

STARTS = Path(__file__).resolve().parents[2] / "data" / "starts"


def _load(name: str) -> RunReport:
    return RunReport.model_validate_json((STARTS / f"{name}.report.rank0.json").read_text())


def test_the_rows_that_changed_most_are_kept_in_their_order() -> None:
    cmp = compare(
        _load("call9.S_llama8b_s128_t4096.apply"), _load("call9.S_llama8b_s128_t4096.enable")
    )
    many = [Delta(key=f"s{i}", label=f"stage {i}", a=0, b=i, delta=i) for i in range(200)]
    total = Delta(key="total", label="Total", a=0, b=1, delta=1)
    shown, more = _capped_rows(cmp.model_copy(update={"stages": [*many, total]}))
    kept = shown["stages"]
    assert len(kept) == PAGE_COMPARE_ROWS and more["stages"] == 201 - PAGE_COMPARE_ROWS
    assert kept[-1].key == "total"
    assert [d.key for d in kept[:-1]] == [f"s{i}" for i in range(200 - PAGE_COMPARE_ROWS + 1, 200)]
    assert more["owners"] == 0 and shown["owners"] == cmp.owners


def test_a_missing_page_is_a_page_for_a_browser_and_json_for_the_api(client: TestClient) -> None:
    browser = {"Accept": "text/html,application/xhtml+xml"}
    for path in ("/models/nope", "/history/nope", "/models/a%0Ab", "/no-such-page"):
        r = client.get(path, headers=browser)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), path
        assert "<h1>Not found</h1>" in r.text and "<script" not in r.text
    assert "no runs of model &#39;nope&#39;" in client.get("/models/nope", headers=browser).text
    api = client.get("/api/v1/runs/nope", headers=browser)
    assert api.status_code == 404 and api.json()["field"] == "run_id"
    assert client.get("/models/nope").json()["field"] == "model"

"""Every surface shows the same figures for one start: CLI, API, dashboard page and /metrics.

Each real vLLM report under tests/data/reports is stored in a fresh service; the five figures
an operator reads (usage minus budget, KV tokens, KV bytes, graph pool, non-KV bytes) are read
from `memest estimate --json`, `memest report`, the run JSON, the model page's text and
`/metrics`, and must be identical. `/metrics` never repeats a series, and labels each one with
the configuration fingerprint the history shows.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from memest.cli import main
from memest.identity import model_display_name
from tests.integration.service.conftest import AUTH, MakeClient, joined_samples

REPORTS = sorted((Path(__file__).parents[2] / "data" / "reports").glob("*.json"))
FIGURES = (
    "usage_minus_budget_bytes",
    "kv_tokens",
    "kv_cache_bytes",
    "graph_pool_bytes",
    "non_kv_bytes",
)
#: Model-page element id and /metrics series of each figure.
PAGE_IDS = {
    "usage_minus_budget_bytes": "fact-usage-minus-budget",
    "kv_tokens": "fact-kv-tokens",
    "kv_cache_bytes": "fact-kv-bytes",
    "graph_pool_bytes": "fact-graph-pool",
    "non_kv_bytes": "fact-non-kv",
}
SERIES = {
    "budget_bytes": "memest_budget_bytes",
    "usage_bytes": "memest_usage_bytes",
    "kv_tokens": "memest_kv_tokens",
    "kv_cache_bytes": "memest_kv_cache_bytes",
    "graph_pool_bytes": "memest_graph_pool_total_bytes",
    "non_kv_bytes": "memest_non_kv_bytes",
}


def test_the_data_holds_the_reports_the_check_needs() -> None:
    names = {p.name for p in REPORTS}
    assert "call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json" in names
    eagle = [n for n in names if "eagle3" in n]
    plain = [n for n in names if "eagle3" not in n]
    assert eagle and plain


def _cli_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any] | None:
    code = main(["estimate", "--from", str(path), "--json"])
    out, err = capsys.readouterr()
    if code == 2:
        return None  # a report memest cannot recompute: refused with a reason, checked below
    assert code == 0, err
    accounting: dict[str, Any] = json.loads(out)["accounting"]
    return accounting


def _page_figures(page: str) -> dict[str, tuple[str, str]]:
    """figure -> (data attribute, shown text) of the model page's fact cards."""
    out = {}
    for figure, element in PAGE_IDS.items():
        m = re.search(rf'id="{element}" data-(?:bytes|value)="([^"]*)">([^<]*)<', page)
        assert m is not None, element
        out[figure] = (html.unescape(m.group(1)), html.unescape(m.group(2)))
    return out


def _shown(figure: str, value: int | None) -> str:
    from memest.units import count_cell, gib_cell

    if figure == "kv_tokens":
        return count_cell(value)
    return gib_cell(value, signed=figure == "usage_minus_budget_bytes")


@pytest.mark.parametrize("path", REPORTS, ids=[p.name.split(".report")[0] for p in REPORTS])
def test_every_surface_shows_the_same_figures(
    path: Path, make_client: MakeClient, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = json.loads(path.read_text())
    client: TestClient = make_client()
    assert client.post("/api/v1/reports", json=report, headers=AUTH).status_code == 201

    run = client.get(f"/api/v1/runs/{quote(report['run_id'], safe='')}").json()
    api = run["accounting"]
    assert {f: run["facts"][f] for f in FIGURES} == {f: api[f] for f in FIGURES}
    assert api["report_id"] == report["report_id"]

    cli = _cli_json(path, capsys)
    if cli is None:
        assert api["definition"] == "stored"
        assert "older definition" in api["definition_note"]
    else:
        assert api["definition"] == "current"
        assert {f: cli[f] for f in FIGURES} == {f: api[f] for f in FIGURES}
        assert cli["estimators"] == api["estimators"]

    model = model_display_name(report["model"])  # a local path is stored under its folder name
    page = client.get(f"/models/{quote(model, safe='')}").text
    for figure, (attribute, text) in _page_figures(page).items():
        assert attribute == ("None" if api[figure] is None else str(api[figure])), figure
        assert text == _shown(figure, api[figure]), figure
    if api["definition"] == "stored":
        assert "Measured by an older definition" in page
    _check_whole_gpu(page, api, report)
    _check_graph_estimate(page, api, report)

    # One build label on every surface: the API, the run page, the index and /metrics.
    build = report["build"]["label"] or (
        f"vllm-{report['build']['vllm_version']}+memest-{report['build']['memest_version']}"
    )
    assert run["run"]["build"] == build
    assert f'<strong id="build">{build}</strong>' in page
    assert build in client.get("/").text
    history = client.get("/api/v1/history", params={"model": model}).json()
    (fingerprint,) = [p["config_fingerprint"] for p in history["points"]]
    assert fingerprint and fingerprint in client.get(f"/history/{quote(model, safe='')}").text
    # The lab named each start by its mode: an apply start's KV cache memest sized, an enable,
    # lite or default start's vLLM did.
    mode, sized_by = ("apply", "memest") if ".apply" in path.name else ("measure", "vllm")
    assert api["kv_sized_by"] == sized_by
    labels = (
        ("build", build),
        ("config", fingerprint),
        ("mode", mode),
        ("model", model),
        ("sized_by", sized_by),
    )
    samples = joined_samples(client.get("/metrics?detail=true").text)
    for figure, name in SERIES.items():
        assert samples.get((name, labels)) == api[figure], figure
    errors = {
        dict(k[1])["estimator"]: v
        for k, v in samples.items()
        if k[0] == "memest_estimator_error_bytes"
    }
    stated = {
        r["estimator"]: r["usage_minus_budget_bytes"]
        for r in api["estimators"]
        if r["usage_minus_budget_bytes"] is not None
    }
    assert errors == stated
    assert errors.get("measured") == api["usage_minus_budget_bytes"]

    assert main(["report", str(path), "--out", str(tmp_path), "--stdout"]) == 0
    markdown = capsys.readouterr().out
    assert (
        f"| Usage minus budget (this start), GiB | {_shown('usage_minus_budget_bytes', api['usage_minus_budget_bytes'])} |"
        in markdown
    )
    assert f"| KV capacity, tokens | {_shown('kv_tokens', api['kv_tokens'])} |" in markdown


def _check_graph_estimate(page: str, api: dict[str, Any], report: dict[str, Any]) -> None:
    """The card's vLLM graph estimate is the one the estimates table uses (the vllm record's);
    what vLLM logged in the start is shown beside it only when it differs."""
    card = re.search(r'id="fact-cg-estimate" data-bytes="([^"]+)"', page)
    assert card is not None
    vllm = next((r for r in api["estimators"] if r["estimator"] == "vllm"), None)
    logged = (report.get("vllm") or {}).get("cudagraph_estimate_bytes")
    expected = (
        vllm["cudagraph_estimate_bytes"] if vllm and vllm["cudagraph_estimate_bytes"] else logged
    )
    assert card.group(1) == str(expected)
    shown_logged = re.search(r'id="fact-cg-logged" data-bytes="(\d+)"', page)
    if logged is not None and logged != expected:
        assert shown_logged is not None and int(shown_logged.group(1)) == logged
    else:
        assert shown_logged is None


def _check_whole_gpu(page: str, api: dict[str, Any], report: dict[str, Any]) -> None:
    """The run page's whole-GPU bar: its parts fill the GPU, its KV part and lines are the API's."""
    picture = re.search(r'<figure class="plot wide" id="whole-gpu-plot">(.*?)</figure>', page, re.S)
    if api["definition"] == "stored":
        assert picture is None
        return
    assert picture is not None
    parts = dict(re.findall(r'data-part="([^"]+)" data-bytes="(\d+)"', picture.group(1)))
    assert int(parts["kv_cache_bytes"]) == api["kv_cache_bytes"]
    assert sum(int(v) for v in parts.values()) == report["gpu"]["total_bytes"]
    stages = {k.removeprefix("stage:"): int(v) for k, v in parts.items() if k.startswith("stage:")}
    nonzero = {k: v for k, v in api["graph_pool_by_stage_bytes"].items() if v}
    assert stages == nonzero
    budget = re.search(r'class="gpu-budget"[^>]*data-bytes="(\d+)"', picture.group(1))
    usage = re.search(r'class="gpu-usage"[^>]*data-bytes="(\d+)"', picture.group(1))
    assert budget is not None and int(budget.group(1)) == api["budget_bytes"]
    assert usage is not None and int(usage.group(1)) == api["usage_bytes"]


def test_one_series_per_configuration_of_a_model(make_client: MakeClient) -> None:
    # GIVEN every real report stored in one service: one model and build, started at several
    # configurations (grids, utilization, drafter), some of them more than once
    client: TestClient = make_client()
    reports = [json.loads(p.read_text()) for p in REPORTS]
    for report in reports:
        assert client.post("/api/v1/reports", json=report, headers=AUTH).status_code == 201
    models = {model_display_name(r["model"]) for r in reports}
    # WHEN /metrics is scraped (twice: the series must not move between scrapes)
    scrapes = [joined_samples(client.get("/metrics?detail=true").text) for _ in range(2)]
    assert scrapes[0] == scrapes[1]
    samples = scrapes[0]
    # THEN each configuration the history shows has one series, the newest run of it
    # and who sized its KV cache (an enable and an apply start of one configuration: two series)
    newest: dict[tuple[str, str, str, str], str] = {}
    for model in models:
        points = client.get("/api/v1/history", params={"model": model}).json()["points"]
        for p in points:  # oldest first
            key = (model, p["build"], p["config_fingerprint"], p["kv_sized_by"])
            newest[key] = p["run_id"]
    assert len({fp for _, _, fp, _ in newest}) > 1
    assert len({(fp, by) for _, _, fp, by in newest}) > len({fp for _, _, fp, _ in newest})
    kv = {k[1]: v for k, v in samples.items() if k[0] == "memest_kv_tokens"}
    expected = {}
    modes = {"vllm": "measure", "memest": "apply"}
    for (model, build, fp, by), run_id in newest.items():
        run = client.get(f"/api/v1/runs/{quote(run_id, safe='')}").json()
        if run["accounting"]["kv_tokens"] is not None:
            labels = (
                ("build", build),
                ("config", fp),
                ("mode", modes[by]),
                ("model", model),
                ("sized_by", by),
            )
            expected[labels] = run["accounting"]["kv_tokens"]
    assert kv == expected
    stored = [dict(labels) for _, labels in samples if "model" in dict(labels)]
    assert stored and all(
        (s["model"], s["build"], s["config"], s["sized_by"]) in newest for s in stored
    )

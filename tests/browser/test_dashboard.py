"""Headless Chromium opens the demo's model, compare and history pages and checks that the numbers
shown are the API's. Set MEMEST_SCREENSHOT_DIR to keep a full-page screenshot of each page."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from memest.builds.history import REGRESSION_LABELS
from memest.units import fmt_gib

pytestmark = pytest.mark.browser

DS = "deepseek-ai/DeepSeek-V4-Flash-DSpark"
MM = "nvidia/MiniMax-M3-NVFP4"
DS_MAIN = "demo-deepseek-v4-flash-dspark-k7-main"
DS_PR = "demo-deepseek-v4-flash-dspark-k7-pr"


def _api(base: str, path: str, **params: str) -> Any:
    r = httpx.get(base + path, params=params, timeout=10)
    r.raise_for_status()
    return r.json()


def _shot(page: Any, name: str) -> None:
    target = os.environ.get("MEMEST_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)


def _clean(page: Any) -> None:
    assert page.outside_requests == [], f"page reached outside the server: {page.outside_requests}"
    assert page.console_errors == []


def test_model_page_matches_api(page: Any, demo_server: str) -> None:
    page.goto(f"{demo_server}/models/{DS}?run={DS_PR}")
    detail = _api(demo_server, f"/api/v1/runs/{DS_PR}")
    facts = detail["facts"]
    assert page.inner_text("#fact-graph-pool") == fmt_gib(facts["graph_pool_bytes"]) == "17.051"
    assert page.inner_text("#fact-kv-tokens") == f"{facts['kv_tokens']:,}" == "6,208,214"
    # Shown as what capture added, or, when it is negative, as what capture freed.
    assert page.get_attribute("#fact-total-added", "data-bytes") == str(facts["total_added_bytes"])
    assert page.inner_text("#fact-total-added") == fmt_gib(abs(facts["total_added_bytes"]))
    # Stacked bars: one SVG segment per (stage, owner), heights from the API's bytes.
    segs = page.eval_on_selector_all(
        "#stage-owner-plot rect.owner-seg",
        "els => els.map(e => [e.closest('g').dataset.stage, e.dataset.owner, Number(e.dataset.bytes), e.getBBox().height])",
    )
    api_segs = [[b["stage"], o["owner"], o["bytes"]] for b in detail["stages"] for o in b["owners"]]
    assert [s[:3] for s in segs] == api_segs
    assert all(h > 0 for s in segs for h in [s[3]] if s[2] > 2**30 // 100)
    # The stage x owner table shows the same bytes as GiB.
    rows = page.eval_on_selector_all(
        "#stage-owner tr.owner-row",
        "els => els.map(e => [e.dataset.stage, e.dataset.owner, e.querySelector('.owner-bytes').innerText])",
    )
    assert rows == [[s, o, fmt_gib(b)] for s, o, b in api_segs]
    # Beside it, the capture plan's graph counts.
    counts = page.eval_on_selector_all(
        "#graph-counts tbody tr",
        "els => els.map(e => [e.dataset.runner, e.querySelector('.graph-count').innerText])",
    )
    assert counts == [[r["runner"], str(r["graph_count"])] for r in detail["runners"]]
    assert [c[1] for c in counts] == ["39", "48", "51"]
    assert page.inner_text("#total-graphs") == "138"
    _shot(page, "model-deepseek-v4-flash-pr")
    _clean(page)


def test_compare_page_matches_api(page: Any, demo_server: str) -> None:
    page.goto(f"{demo_server}/compare?a={DS_MAIN}&b={DS_PR}")
    cmp = _api(demo_server, "/api/v1/compare", a=DS_MAIN, b=DS_PR)
    assert page.inner_text("#kv-ratio") == f"{cmp['kv_ratio']:.2f}×" == "0.81×"
    for table, key, fmt in (
        ("stages", "stages", fmt_gib),
        ("stage-counts", "stage_graph_counts", str),
    ):
        shown = page.eval_on_selector_all(
            f"#{table} tbody tr",
            "els => els.map(e => [e.dataset.key, e.querySelector('.val-a').innerText, e.querySelector('.val-b').innerText])",
        )
        assert shown == [[d["key"], fmt(d["a"]), fmt(d["b"])] for d in cmp[key]]
    totals = page.eval_on_selector_all(
        "#stages tr.total td.num", "els => els.slice(0, 2).map(e => e.innerText)"
    )
    assert totals == ["4.326", "17.051"]
    bars = page.eval_on_selector_all(
        "#compare-plot rect.cmp-bar",
        "els => els.map(e => [e.dataset.stage, e.dataset.side, Number(e.dataset.bytes)])",
    )
    expected = []
    for d in cmp["stages"]:
        if d["key"] != "total":
            expected += [[d["key"], "a", d["a"]], [d["key"], "b", d["b"]]]
    assert bars == expected
    _shot(page, "compare-deepseek-v4-flash-main-pr")
    _clean(page)


def test_history_page_matches_api_and_marks_regressions(page: Any, demo_server: str) -> None:
    page.goto(f"{demo_server}/history/{MM}")
    hist = _api(demo_server, "/api/v1/history", model=MM)
    rows = page.eval_on_selector_all(
        "#history tbody tr",
        "els => els.map(e => [e.dataset.run, e.querySelector('.kv').innerText, e.querySelector('.pool').innerText, e.querySelector('.regressions').innerText, e.classList.contains('regressed')])",
    )
    assert rows == [
        [
            p["run_id"],
            f"{p['kv_tokens']:,}",
            fmt_gib(p["graph_pool_bytes"]),
            ", ".join(REGRESSION_LABELS[k] for k in p["regressions"]),
            bool(p["regressions"]),
        ]
        for p in hist["points"]
    ]
    # KV 3,575,296 -> 3,358,336 (0.94x) and pool 1.799 -> 6.127 GiB: both regress on the PR.
    assert hist["points"][1]["regressions"] == ["kv_tokens", "graph_pool_bytes"]
    assert rows[1][3] == "KV tokens dropped, graph pool grew"
    red = page.eval_on_selector_all("svg circle.regression", "els => els.length")
    assert red == sum(len(p["regressions"]) for p in hist["points"])
    _shot(page, "history-minimax-m3")
    _clean(page)

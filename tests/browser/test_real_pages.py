"""Headless Chromium at 1400 px on real H200 starts (vLLM 0.33.0, Llama-3-8B shape): the run,
compare and history pages show the API's numbers, name what they show, and compare like with like.

The starts: call3.A (128 seqs, utilization 0.85; its owners carry Inductor's hashed file names),
call6.D (the same configuration at utilization 0.70), call8.E (EAGLE3 K=5, KV sized by memest),
and the other real reports under tests/data/reports. Set MEMEST_SCREENSHOT_DIR to keep a
full-page screenshot of each page (reports/service/ holds the committed ones).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from memest.builds.history import REGRESSION_LABELS
from memest.units import count_cell, fmt_gib, gib_cell, ratio_cell
from tests.browser.conftest import demo_service

pytestmark = pytest.mark.browser

DATA = Path(__file__).parents[1] / "data"
STARTS = [
    DATA / "starts" / "call3.A_llama8b_s128_t4096.enable.report.rank0.json",
    *sorted((DATA / "reports").glob("*.json")),
]
MODEL = "llama8b"  # stored under its folder name; the reports carry the local path
A = "A_llama8b_s128_t4096.enable"
D = "D_llama8b_s128_t4096_u070.apply"
E = "E_llama8b_eagle3k5_s96_t4096_u088.apply"
WIDTH = 1400


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with demo_service(
        tmp_path_factory.mktemp("real") / "memest.db", write_token="browser-write-token"
    ) as url:
        for path in STARTS:
            r = httpx.post(
                f"{url}/api/v1/reports",
                content=path.read_bytes(),
                headers={
                    "Authorization": "Bearer browser-write-token",
                    "Content-Type": "application/json",
                },
                timeout=30,
            )
            # The demo already holds some of these starts (memest/demo/h200): stored once.
            already = r.status_code == 409 and "already has rank 0" in r.text
            assert r.status_code in (200, 201) or already, r.text
        yield url


@pytest.fixture
def wide(browser: Any, real_server: str) -> Iterator[Any]:
    """A 1400 px page that may load only the server; console errors are recorded."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    pg = context.new_page()
    pg.console_errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))  # type: ignore[attr-defined]
    pg.route(
        "**/*", lambda r: r.continue_() if r.request.url.startswith(real_server) else r.abort()
    )
    yield pg
    assert pg.console_errors == []  # type: ignore[attr-defined]
    context.close()


def _api(base: str, path: str, **params: str) -> Any:
    r = httpx.get(base + path, params=params, timeout=10)
    r.raise_for_status()
    return r.json()


def _shot(page: Any, name: str) -> None:
    target = os.environ.get("MEMEST_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)


def _run_url(base: str, run: str) -> str:
    return f"{base}/models/{quote(MODEL, safe='')}?run={quote(run)}"


def _check_budget_splits(page: Any, accounting: dict[str, Any], sized_by: str) -> None:
    """vLLM's and memest's split of the budget under the whole GPU: each from its estimator
    record, each filling the budget, on the whole GPU's scale (the KV part ends at the budget
    line), the estimator that sized the start named."""
    records = {r["estimator"]: r for r in accounting["estimators"]}
    vllm, memest = records["vllm"], records["memest"]
    expected = {
        "vllm": {
            "non_kv_bytes": vllm["non_kv_cache_bytes"],
            "graph_bytes": vllm["cudagraph_estimate_bytes"],
            "kv_cache_bytes": vllm["kv_cache_bytes"],
        },
        # memest's non-KV figure holds its graph pools; the bar shows them apart.
        "memest": {
            "non_kv_bytes": memest["non_kv_cache_bytes"] - memest["cudagraph_estimate_bytes"],
            "graph_bytes": memest["cudagraph_estimate_bytes"],
            "kv_cache_bytes": memest["kv_cache_bytes"],
        },
    }
    shown = page.eval_on_selector_all(
        "#whole-gpu-plot g.budget-split",
        "gs => gs.map(g => [g.dataset.estimator, [...g.querySelectorAll('rect.budget-part')]"
        ".map(r => [r.dataset.split, +r.dataset.bytes, r.getBoundingClientRect().right]),"
        " g.querySelector('text').textContent])",
    )
    assert [s[0] for s in shown] == ["vllm", "memest"]
    budget_x = page.eval_on_selector(
        "#whole-gpu-plot line.gpu-budget", "e => e.getBoundingClientRect().left + 1"
    )
    for name, parts, caption in shown:
        assert {k: b for k, b, _ in parts} == expected[name]
        assert sum(b for _, b, _ in parts) == accounting["budget_bytes"]
        assert abs(parts[-1][2] - budget_x) < 2  # the KV part ends on the budget line
        assert f"KV cache {fmt_gib(expected[name]['kv_cache_bytes'])}" in caption
        assert f"({records[name]['kv_tokens']:,} tokens)" in caption
        assert ("(sized this start)" in caption) == (name == sized_by)


def _check_tables_pair(page: Any) -> None:
    """The stage x owner table and the capture plan side by side, owner labels on one line."""
    left = page.eval_on_selector("#stage-owner", "e => e.getBoundingClientRect()")
    right = page.eval_on_selector("#graph-counts", "e => e.getBoundingClientRect()")
    assert right["left"] >= left["right"] and abs(right["top"] - left["top"]) < 2
    heights = page.eval_on_selector_all(
        "#stage-owner .owner-label", "els => els.map(e => e.getClientRects().length)"
    )
    assert heights and all(n == 1 for n in heights)


def test_run_page_of_a_real_start(wide: Any, real_server: str) -> None:
    wide.goto(_run_url(real_server, A))
    detail = _api(real_server, f"/api/v1/runs/{A}")
    facts = detail["facts"]
    # The KV cache in GiB and tokens, and requests of max_model_len, from the one accounting.
    assert wide.inner_text("#fact-kv-bytes") == fmt_gib(facts["kv_cache_bytes"]) == "102.998"
    assert wide.inner_text("#fact-kv-tokens") == count_cell(facts["kv_tokens"]) == "843,760"
    assert wide.inner_text("#fact-concurrency") == ratio_cell(facts["max_concurrency"])
    assert facts["max_concurrency"] == facts["kv_tokens"] / 4096
    assert wide.inner_text("#fact-usage-minus-budget") == gib_cell(
        facts["usage_minus_budget_bytes"], signed=True
    )
    # The whole GPU: its parts add up to the GPU's total and its KV part is the fact card's.
    parts = wide.eval_on_selector_all(
        "#whole-gpu-plot rect.gpu-part", "els => els.map(e => [e.dataset.part, +e.dataset.bytes])"
    )
    assert dict(parts)["kv_cache_bytes"] == facts["kv_cache_bytes"]
    assert sum(b for _, b in parts) == json.loads(STARTS[0].read_text())["gpu"]["total_bytes"]
    _check_budget_splits(wide, detail["accounting"], sized_by="vllm")

    # Stage x owner: the API's segments, drawn across the page, owners named by what they are.
    segs = wide.eval_on_selector_all(
        "#stage-owner-plot rect.owner-seg",
        "els => els.map(e => [e.closest('g').dataset.stage, e.dataset.owner, +e.dataset.bytes,"
        " e.getBoundingClientRect().width])",
    )
    api = [[b["stage"], o["owner"], o["bytes"]] for b in detail["stages"] for o in b["owners"]]
    assert [s[:3] for s in segs] == api
    assert all(re.search(r"/c[a-z0-9]{40,}\.py", s[1]) for s in segs)  # hashed Inductor files
    assert all(s[3] > 50 for s in segs)
    legend = wide.eval_on_selector_all(
        "#stage-owner-plot g.legend-entry text", "els => els.map(e => e.firstChild.textContent)"
    )
    assert legend and all(".py" not in t for t in legend)
    _check_tables_pair(wide)
    assert legend[0].startswith("compiled code (Inductor call; owner not named) · 0.061 GiB")
    chart = wide.eval_on_selector("#stage-owner-plot svg", "e => e.getBoundingClientRect().width")
    assert chart >= 1000

    # Phases: nested ones say where they run; the negative categories carry the footnote.
    rows = wide.eval_on_selector_all(
        "#phase-split tbody tr", "els => els.map(e => [e.dataset.phase, e.dataset.parent || null])"
    )
    parents = dict(rows)
    assert parents["kv_cache_alloc"] == "initialize_from_config"
    assert parents["capture"] == "compile_or_warm_up_model"
    assert parents["initialize_from_config"] is None
    assert wide.locator("#phase-split td.neg").count() == 2  # capture: total and other PyTorch
    assert "Negative: the phase gave memory back" in wide.inner_text("#phase-notes")

    # Notes: no host paths; the plugin's diagnostics folded away.
    text = wide.inner_text("main")
    assert "/tmp/" not in text and "/work/" not in text
    assert wide.locator("#notes li").count() <= 4
    assert "history stage row" not in wide.inner_text("#notes")
    assert wide.locator("#more-notes").count() == 1
    _shot(wide, "run-llama8b-s128-t4096")


def test_apply_mode_run_page_has_no_vllm_usage_card(wide: Any, real_server: str) -> None:
    wide.goto(_run_url(real_server, E))
    facts = _api(real_server, f"/api/v1/runs/{E}")["facts"]
    assert facts["kv_sized_by"] == "memest"
    assert wide.get_attribute("#kv-sized-by", "data-value") == "memest"
    assert wide.inner_text("#kv-sized-by") == "memest (MEMEST_ESTIMATE=apply)"
    assert wide.locator("#fact-estimator-error").count() == 0
    assert wide.inner_text("#fact-kv-bytes") == fmt_gib(facts["kv_cache_bytes"])
    labels = wide.eval_on_selector_all(
        "#stage-owner-plot g.legend-entry", "els => els.map(e => e.dataset.label)"
    )
    assert len(set(labels)) == len(labels) >= 2
    colors = wide.eval_on_selector_all(
        "#stage-owner-plot g.legend-entry rect", "els => els.map(e => e.getAttribute('fill'))"
    )
    assert len(set(colors)) == len(colors)
    _check_budget_splits(wide, _api(real_server, f"/api/v1/runs/{E}")["accounting"], "memest")
    _check_tables_pair(wide)
    _shot(wide, "run-llama8b-eagle3k5-apply")


def test_compare_page_names_what_it_compares(wide: Any, real_server: str) -> None:
    wide.goto(f"{real_server}/compare?a={A}&b={D}")
    cmp = _api(real_server, "/api/v1/compare", a=A, b=D)
    # A is an enable start (vLLM sized its KV cache), D an apply start (memest did).
    assert [c["field"] for c in cmp["changes"]] == ["kv_sized_by", "gpu_memory_utilization"]
    title = wide.inner_text("#compare-title")
    assert title.startswith("llama8b: A → B") and "gpu_memory_utilization 0.85 → 0.7" in title
    heads = wide.eval_on_selector_all("#stages thead th", "els => els.map(e => e.innerText)")
    assert heads[2:4] == ["A", "B"]
    # A's KV cache was sized by vLLM, D's by memest (apply): both differences are named.
    assert (
        wide.inner_text("#changes")
        == "Differences: KV cache sized by vLLM → memest (MEMEST_ESTIMATE=apply); "
        "gpu_memory_utilization 0.85 → 0.7."
    )
    legend = wide.eval_on_selector_all(
        "#compare-plot svg text", "els => els.map(e => e.textContent)"
    )
    assert "A" in legend and "B" in legend and "?" not in legend
    shown = wide.eval_on_selector_all(
        "#stages tbody tr",
        "els => els.map(e => [e.dataset.key, e.querySelector('.val-a').innerText,"
        " e.querySelector('.val-b').innerText])",
    )
    assert shown == [[d["key"], gib_cell(d["a"]), gib_cell(d["b"])] for d in cmp["stages"]]
    kv = next(d for d in cmp["estimate"] if d["key"] == "kv_tokens")
    assert wide.inner_text("#kv-tokens-ab") == f"{kv['a']:,} → {kv['b']:,} tokens"
    assert wide.inner_text("#kv-ratio") == ratio_cell(cmp["kv_ratio"]) == "0.79×"
    _shot(wide, "compare-llama8b-u085-u070")


def test_demo_compare_shows_the_main_regression(wide: Any, real_server: str) -> None:
    a, b = "demo-deepseek-v4-flash-dspark-k7-main", "demo-deepseek-v4-flash-dspark-k7-pr"
    wide.goto(f"{real_server}/compare?a={a}&b={b}")
    cmp = _api(real_server, "/api/v1/compare", a=a, b=b)
    fp32 = next(d for d in cmp["owners"] if d["key"] == "target.full/indexer_logits_fp32")
    assert (fp32["a"], fp32["delta"]) == (0, fp32["b"])
    row = wide.locator('#owners tr[data-key="target.full/indexer_logits_fp32"]')
    assert row.locator("td.delta").inner_text() == "+8.016"
    assert wide.inner_text("#compare-title") == "deepseek-ai/DeepSeek-V4-Flash-DSpark: main → PR"


def test_history_compares_within_one_configuration(wide: Any, real_server: str) -> None:
    wide.goto(f"{real_server}/history/{quote(MODEL, safe='')}")
    hist = _api(real_server, "/api/v1/history", model=MODEL)
    points = {p["run_id"]: p for p in hist["points"]}
    # D is A's configuration at utilization 0.70: fewer KV tokens, yet no regression of A.
    assert points[D]["kv_tokens"] < points[A]["kv_tokens"] * 0.8
    assert points[D]["config_fingerprint"] != points[A]["config_fingerprint"]
    assert points[D]["regressions"] == [] and points[D]["compared_with"] is None
    rows = wide.eval_on_selector_all(
        "#history tbody tr",
        "els => els.map(e => [e.dataset.run, e.querySelector('.kv').innerText,"
        " e.querySelector('.pool').innerText, e.querySelector('.regressions').innerText])",
    )
    assert rows == [
        [
            p["run_id"],
            count_cell(p["kv_tokens"]),
            gib_cell(p["graph_pool_bytes"]),
            ", ".join(REGRESSION_LABELS[k] for k in p["regressions"]),
        ]
        for p in hist["points"]
    ]
    # What changed from the run before: field names in one line, values when opened.
    changed = wide.locator(f'#history tr[data-run="{D}"] details.changed')
    assert "gpu_memory_utilization" in changed.locator("summary").inner_text()
    changed.locator("summary").click()
    assert "gpu_memory_utilization 0.85 → 0.7" in changed.inner_text()
    # Compared with: the run numbers the table and the chart's x axis share.
    numbers = {p["run_id"]: i for i, p in enumerate(hist["points"], start=1)}
    for p in hist["points"]:
        cell = wide.inner_text(f'#history tr[data-run="{p["run_id"]}"] td.compared')
        base = p["compared_with"]
        expected = (
            f"#{numbers[base]} → #{numbers[p['run_id']]}"
            if base
            else "first of its configuration and sizing"
        )
        assert cell == expected
        assert wide.inner_text(f'#history tr[data-run="{p["run_id"]}"] td.run-number') == str(
            numbers[p["run_id"]]
        )
    x_labels = wide.eval_on_selector_all(
        'svg[data-metric="kv_tokens"] text[transform]',
        "els => els.map(e => [e.firstChild.textContent, e.querySelector('title').textContent])",
    )
    assert x_labels == [[f"#{n}", run] for run, n in numbers.items()]
    # Ticks on nice steps, every x label inside its chart.
    for metric in ("kv_tokens", "graph_pool_bytes", "usage_minus_budget_bytes"):
        svg = f'svg[data-metric="{metric}"]'
        ticks = wide.eval_on_selector_all(
            f"{svg} text[text-anchor=end][font-size='10']:not([transform])",
            "els => els.map(e => e.textContent)",
        )
        values = [float(t.rstrip("kM")) for t in ticks]
        steps = {round(b - a, 6) for a, b in zip(values, values[1:], strict=False)}
        assert len(values) >= 3 and len(steps) == 1, ticks
        mantissa = steps.pop() / 10 ** math.floor(math.log10(abs(values[1] - values[0])))
        assert round(mantissa, 6) in (1, 2, 2.5, 5), ticks
        inside = wide.eval_on_selector(
            svg,
            "s => { const r = s.getBoundingClientRect(); return [...s.querySelectorAll("
            "'text[transform]')].every(t => { const b = t.getBoundingClientRect();"
            " return b.left >= r.left - 1 && b.bottom <= r.bottom + 1; }); }",
        )
        assert inside, metric
    kv_ticks = wide.eval_on_selector_all(
        'svg[data-metric="kv_tokens"] text[font-size="10"]:not([transform])',
        "els => els.map(e => e.textContent)",
    )
    assert all(re.fullmatch(r"\d+k", t) for t in kv_ticks), kv_ticks
    _shot(wide, "history-llama8b")


@pytest.mark.parametrize(
    "path",
    [
        "/models/llama8b?run=" + A,
        "/models/llama8b?run=" + E,
        "/models/deepseek-ai%2FDeepSeek-V4-Flash-DSpark",
        f"/compare?a={A}&b={D}",
        f"/compare?a={A}&b={E}",
        "/history/llama8b",
        "/history/nvidia%2FMiniMax-M3-NVFP4",
        "/",
    ],
)
def test_pages_fit_1400_px(wide: Any, real_server: str, path: str) -> None:
    wide.goto(real_server + path)
    for details in wide.locator("details").all():  # opened notes and changes must fit too
        details.evaluate("e => { e.open = true; }")
    width = wide.evaluate("document.documentElement.scrollWidth")
    assert width <= WIDTH, f"{path} is {width} px wide"

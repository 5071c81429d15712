"""The run page's what-if form in headless Chromium: push a real H200 report, change the grid on
its page, and check that the figures shown are the API's for the same request body; a refused
field is one readable line; with MEMEST_READ_TOKEN set, the login session alone is enough.
Set MEMEST_SCREENSHOT_DIR to keep a screenshot of the answered form."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from memest.identity import model_display_name
from memest.units import count_cell, fmt_gib, ratio_cell
from tests.browser.conftest import demo_service

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "tests" / "data" / "starts"
PLAIN = RAW / "call9.S_llama8b_s128_t4096.apply.report.rank0.json"
EAGLE = RAW / "call6.C_llama8b_eagle3k3_s64_t4096.apply.report.rank0.json"
WRITE = "whatif-write-token"
READ = "whatif-read-token"


def _push(base: str, path: Path, headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = httpx.post(
        base + "/api/v1/reports",
        content=path.read_bytes(),
        headers={"Authorization": f"Bearer {WRITE}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    report: dict[str, Any] = json.loads(path.read_bytes())
    return report


def _run_page(base: str, report: dict[str, Any]) -> str:
    model = model_display_name(report["model"])  # a local path is stored under its folder name
    return f"{base}/models/{quote(model, safe='')}?run={quote(report['run_id'], safe='')}"


def _estimate(base: str, run_id: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    r = httpx.post(
        f"{base}/api/v1/runs/{quote(run_id, safe='')}/estimate",
        json=body,
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _submit(page: Any) -> None:
    done = page.get_attribute("#whatif", "data-done") or "0"
    page.click("#wi-submit")
    page.wait_for_selector(f'#whatif[data-done="{int(done) + 1}"]', timeout=60_000)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("whatif") / "memest.db"
    with demo_service(db, write_token=WRITE) as url:
        yield url


def test_changed_max_num_seqs_shows_the_apis_figures(page_on: Any, server: str) -> None:
    page = page_on(server)
    report = _push(server, PLAIN)
    page.goto(_run_page(server, report))
    assert page.input_value("#wi-max-num-seqs") == "128"
    page.fill("#wi-max-num-seqs", "32")
    _submit(page)
    assert page.is_hidden("#whatif-error")
    api = _estimate(server, report["run_id"], {"grid": {"max_num_seqs": 32}})
    w = api["what_if"]
    # The form sent only what changed: the same body gives the same answer.
    assert page.inner_text("#wi-kv-gib-from") == fmt_gib(w["kv_budget_bytes_from"])
    assert page.inner_text("#wi-kv-gib-to") == fmt_gib(w["kv_budget_bytes_to"])
    assert page.get_attribute("#wi-kv-gib-to", "data-value") == str(w["kv_budget_bytes_to"])
    assert page.inner_text("#wi-kv-tokens-to") == count_cell(w["kv_tokens_to"])
    assert page.inner_text("#wi-kv-tokens-from") == count_cell(w["kv_tokens_from"])
    assert page.inner_text("#wi-concurrency-to") == ratio_cell(api["concurrency_to"])
    assert (
        page.inner_text("#wi-flag")
        == api["kv_cache_flag_to"]
        == f"--kv-cache-memory-bytes={api['kv_cache_memory_bytes_to']}"
    )
    # Fewer sequences leave more for the KV cache (smaller graph pools and buffers).
    assert w["kv_budget_bytes_to"] > w["kv_budget_bytes_from"]
    rows = page.eval_on_selector_all(
        "#whatif-terms tbody tr",
        "els => els.map(e => [e.dataset.term, Number(e.querySelector('.term-from').dataset.bytes),"
        " Number(e.querySelector('.term-to').dataset.bytes), e.querySelector('.law').innerText])",
    )
    # A zero MLA row is left off a dense model's table (memest.reporters.views.FAMILY_TERMS).
    shown = [
        t
        for t in api["terms"]
        if t["term"] != "mla_context_bytes" or t["bytes_from"] or t["bytes_to"]
    ]
    assert rows == [[t["term"], t["bytes_from"], t["bytes_to"], t["law"]] for t in shown]
    moved = {r[0]: r[3] for r in rows}
    assert moved["graph_pool_bytes"].startswith("per-owner pool laws")
    assert "graph count" in moved["outside_torch_bytes"]
    target = os.environ.get("MEMEST_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.locator("#whatif").screenshot(path=str(Path(target) / "whatif-form.png"))
    assert page.outside_requests == [] and page.console_errors == []


def test_drafter_off_and_a_refused_field(page_on: Any, server: str) -> None:
    page = page_on(server)
    report = _push(server, EAGLE)
    page.goto(_run_page(server, report))
    assert page.input_value("#wi-spec-method") == "eagle3"
    page.check("#wi-drafter-off")
    _submit(page)
    api = _estimate(server, report["run_id"], {"grid": {"speculative_config": None}})
    assert page.get_attribute("#wi-kv-gib-to", "data-value") == str(
        api["what_if"]["kv_budget_bytes_to"]
    )
    assert "draft" not in api["what_if"]["grid_to"]
    # Dropping the drafter frees memory: G' holds more KV than G.
    assert api["what_if"]["kv_budget_bytes_to"] > api["what_if"]["kv_budget_bytes_from"]
    page.uncheck("#wi-drafter-off")
    page.fill("#wi-max-num-seqs", "0")
    _submit(page)
    line = page.inner_text("#whatif-error")
    assert "max_num_seqs" in line and "\n" not in line
    assert page.is_hidden("#whatif-result")
    # The 422 is the one console error expected (the browser logs the failed fetch).
    assert [e for e in page.console_errors if "status of 422" not in e] == []


def test_the_login_session_is_enough(
    browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    db = tmp_path_factory.mktemp("whatif-guarded") / "memest.db"
    with demo_service(db, write_token=WRITE, read_token=READ) as base:
        report = _push(base, PLAIN)
        context = browser.new_context()
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(_run_page(base, report))
        assert "/login" in page.url
        page.fill("#token", READ)
        page.click("button[type=submit]")
        page.wait_for_selector("#whatif-form")
        page.fill("#wi-max-num-batched-tokens", "2048")
        _submit(page)
        assert page.is_hidden("#whatif-error"), page.inner_text("#whatif-error")
        api = _estimate(
            base,
            report["run_id"],
            {"grid": {"max_num_batched_tokens": 2048}},
            Authorization=f"Bearer {READ}",
        )
        assert page.get_attribute("#wi-kv-gib-to", "data-value") == str(
            api["what_if"]["kv_budget_bytes_to"]
        )
        # Without the session or a token the route is closed like every read.
        r = httpx.post(f"{base}/api/v1/runs/{quote(report['run_id'], safe='')}/estimate", json={})
        assert r.status_code == 401
        assert errors == []
        context.close()


@pytest.fixture
def page_on(browser: Any) -> Iterator[Any]:
    """A page that may load only the given server: other hosts are blocked and recorded."""
    contexts: list[Any] = []

    def make(base: str) -> Any:
        context = browser.new_context(viewport={"width": 1300, "height": 900})
        contexts.append(context)
        pg = context.new_page()
        pg.outside_requests = []
        pg.console_errors = []

        def route(r: Any) -> None:
            if r.request.url.startswith(base):
                r.continue_()
            else:
                pg.outside_requests.append(r.request.url)
                r.abort()

        pg.route("**/*", route)
        pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
        return pg

    yield make
    for c in contexts:
        c.close()

"""With MEMEST_READ_TOKEN set, a person logs in with the form and reads the dashboard in Chromium;
the pages keep to the Content-Security-Policy (a violation is a console error)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import demo_service

pytestmark = pytest.mark.browser

READ = "browser-read-token"


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("guarded") / "memest.db"
    with demo_service(db, write_token="browser-write-token", read_token=READ) as url:
        yield url


def test_log_in_then_read_the_dashboard(browser: Any, guarded_server: str) -> None:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.goto(guarded_server + "/models/nvidia%2FMiniMax-M3-NVFP4")
    assert "/login" in page.url
    page.fill("#token", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".error").inner_text() == "That token is not the server's."
    page.fill("#token", READ)
    page.click("button[type=submit]")
    page.wait_for_url(guarded_server + "/models/nvidia%2FMiniMax-M3-NVFP4")
    assert page.locator("h1").first.inner_text().startswith("nvidia/MiniMax-M3-NVFP4")
    assert page.locator("svg.swatch rect").count() > 0
    page.click("a.brand")
    # The demo's models: the two published GB200 deployments (DeepSeek-V4-Flash, MiniMax-M3)
    # and the H200 starts' three (llama8b, dsv2lite_8l, qwen3moe_8l).
    assert page.locator("#models tbody tr").count() == 5
    cookie = next(c for c in context.cookies() if c["name"] == "memest_session")
    assert cookie["httpOnly"] and cookie["value"] != READ
    assert page.evaluate("document.cookie") == ""
    page.click("form.logout button")
    page.goto(guarded_server + "/")
    assert "/login" in page.url
    # The wrong token's 401 is the one resource error expected; no CSP violation or other error.
    assert [e for e in errors if "status of 401" not in e] == []
    context.close()

"""Browser fixtures: the demo service on a real uvicorn (loopback) and headless Chromium."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_or_skip
from tests.live_server import serve

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def _chromium() -> str | None:
    env = os.environ.get("MEMEST_CHROMIUM")
    if env and Path(env).exists():
        return env
    for c in CHROMIUM_CANDIDATES:
        if Path(c).exists():
            return c
    return shutil.which("chromium")


@contextmanager
def demo_service(db: Path, **settings: Any) -> Iterator[str]:
    """The demo service on a real uvicorn (loopback), SQLite at ``db``; yields its base URL."""
    try:
        import uvicorn  # noqa: F401

        from memest.service import create_app
        from memest.service.config import Settings
    except ImportError as exc:
        require_or_skip("MEMEST_REQUIRE_BROWSER", f"service extra missing: {exc}")
        raise
    app = create_app(Settings(database_url=f"sqlite:///{db}", demo=True, **settings))
    with serve(app, start_timeout_s=20) as url:
        yield url


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with demo_service(
        tmp_path_factory.mktemp("browser") / "memest.db", write_token="browser-write-token"
    ) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_or_skip(
            "MEMEST_REQUIRE_BROWSER", "playwright is not installed (pip install playwright)"
        )
        raise
    if exe is None:
        require_or_skip(
            "MEMEST_REQUIRE_BROWSER", "Chromium not found (apt-get install -y chromium)"
        )
        raise RuntimeError("unreachable")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, demo_server: str) -> Iterator[Any]:
    """A page that may load only the demo server: any other host is blocked and recorded."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.outside_requests = []  # type: ignore[attr-defined]
    pg.console_errors = []  # type: ignore[attr-defined]

    def route(r: Any) -> None:
        if r.request.url.startswith(demo_server):
            r.continue_()
        else:
            pg.outside_requests.append(r.request.url)  # type: ignore[attr-defined]
            r.abort()

    pg.route("**/*", route)
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))  # type: ignore[attr-defined]
    yield pg
    context.close()

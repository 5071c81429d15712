"""The model, compare and history pages are built in the page workers (memest.service.pages in a
ComputePool of MEMEST_PAGE_WORKERS processes), on SQLite and PostgreSQL, with the pool's
deadline answers; a killed worker is replaced."""

from __future__ import annotations

import os
import signal
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from memest.demo import demo_report
from memest.service.compute import ComputePool
from tests.integration.service.conftest import AUTH, MakeClient


def _store(client: TestClient, *names: str) -> tuple[str, list[str]]:
    """Stores the demo's main and PR runs of the MiniMax model; its name and the run ids."""
    runs = []
    for which in names:
        report = demo_report("minimax-m3-eagle3-k3", which)
        answer = client.post(
            "/api/v1/reports",
            content=report.model_dump_json(),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert answer.status_code in (200, 201), answer.text
        runs.append(report.run_id)
        model = report.model
    return model, runs


def _pool(client: TestClient) -> ComputePool:
    pool: ComputePool = client.app.state.page_pool  # type: ignore[attr-defined]
    return pool


def _worker_pids(pool: ComputePool) -> set[int]:
    return {w.process.pid for w in pool._idle if w.process.pid is not None}


def _pages(model: str, runs: list[str]) -> list[str]:
    m = quote(model, safe="")
    return [f"/models/{m}", f"/compare?a={runs[0]}&b={runs[1]}", f"/history/{m}"]


@pytest.mark.parametrize("backend", ["sqlite_url", "pg_url"])
def test_each_page_is_built_in_a_page_worker_once(
    make_client: MakeClient, request: pytest.FixtureRequest, backend: str
) -> None:
    client = make_client(database_url=request.getfixturevalue(backend))
    model, runs = _store(client, "main", "PR")
    pool = _pool(client)
    assert pool.started == 0  # no page yet: no worker either
    for n, path in enumerate(_pages(model, runs), start=1):
        answer = client.get(path)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "text/html; charset=utf-8"
        assert pool.started == n, path
    # The workers are processes of their own, and the calculators' pool did none of it.
    assert _worker_pids(pool) and os.getpid() not in _worker_pids(pool)
    assert client.app.state.compute_pool.started == 0  # type: ignore[attr-defined]
    # Asked again, each page is the response cache's: no build.
    for path in _pages(model, runs):
        first = client.get(path)
        assert first.status_code == 200
    assert pool.started == 3


def test_a_page_past_the_deadline_is_a_503_or_504_naming_the_setting(
    make_client: MakeClient,
) -> None:
    client = make_client(compute_deadline_s=0.001)
    model, runs = _store(client, "main", "PR")
    for path in _pages(model, runs):
        answer = client.get(path)
        assert answer.status_code in (503, 504), answer.text
        assert "MEMEST_" in answer.json()["detail"]


def test_a_killed_page_worker_is_replaced(make_client: MakeClient) -> None:
    client = make_client(page_workers=1)
    model, runs = _store(client, "main", "PR")
    pool = _pool(client)
    assert client.get(_pages(model, runs)[0]).status_code == 200
    (pid,) = _worker_pids(pool)
    os.kill(pid, signal.SIGKILL)
    pool._idle[0].process.join(10)  # reaped: the pool sees it dead
    answer = client.get(_pages(model, runs)[1])
    assert answer.status_code == 200, answer.text
    (fresh,) = _worker_pids(pool)
    assert fresh != pid


def test_a_history_page_past_the_last_is_a_404_and_keeps_the_history(
    make_client: MakeClient,
) -> None:
    client = make_client()
    model, _ = _store(client, "main", "PR")
    pool = _pool(client)
    path = f"/history/{quote(model, safe='')}"
    answer = client.get(path, params={"page": 2})
    assert answer.status_code == 404, answer.text
    assert answer.json()["field"] == "page"
    # The history the worker built for it is kept: the first page renders from it.
    entries: Any = client.app.state.history_entries  # type: ignore[attr-defined]
    assert any(key[0] == "history" for key in entries._items if isinstance(key, tuple))
    assert client.get(path).status_code == 200
    assert pool.started == 2

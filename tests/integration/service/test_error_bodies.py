"""Every error the service answers is one JSON body: a failing database (a full disk) is a 503,
anything unexpected a 500, neither ever Starlette's text/plain page."""

from __future__ import annotations

import json
import sqlite3

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from memest.demo import demo_report
from memest.service import store
from memest.service.routers import reports
from tests.integration.service.conftest import AUTH


def _body() -> str:
    data = json.loads(demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json())
    data.update(source="synthetic", report_id="full-r0", run_id="full")
    return json.dumps(data)


def test_a_full_disk_is_a_503_with_a_json_body(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_args: object, **_kwargs: object) -> None:
        raise OperationalError(
            "INSERT INTO reports ...", {}, sqlite3.OperationalError("database or disk is full")
        )

    monkeypatch.setattr(store, "store_prepared", full)
    answer = client.post(
        "/api/v1/reports", content=_body(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert answer.status_code == 503
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {
        "detail": "the database could not complete the request; try again later"
    }


def test_an_unexpected_error_is_a_500_with_a_json_body(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(reports, "_prepare_and_store", broken)
    quiet = TestClient(client.app, raise_server_exceptions=False)
    answer = quiet.post(
        "/api/v1/reports", content=_body(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"detail": "internal error (logged on the server)"}


def test_readyz_is_not_ok_when_the_database_folder_takes_no_write(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    from memest.service.routers import health

    assert client.get("/readyz").json() == {"status": "ok"}

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(health.os, "fsync", full)
    answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {
        "status": "not ok",
        "detail": f"database folder: {os.strerror(errno.ENOSPC)}",
    }
    # Liveness is not readiness: the server itself is fine.
    assert client.get("/healthz").json() == {"status": "ok"}


def test_a_body_trickled_past_the_deadline_is_a_408(
    live_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket
    import time
    from urllib.parse import urlsplit

    import httpx

    from memest.service import body as body_edge

    monkeypatch.setattr(body_edge, "BODY_READ_TIMEOUT_S", 0.5)
    body = _body().encode()
    where = urlsplit(live_server)
    head = (
        f"POST /api/v1/reports HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: {AUTH['Authorization']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall(head + body[:10])
        time.sleep(1.5)  # past the deadline; the rest never comes in time
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"408", answer[:300]
    assert rest.split(b"\r\n\r\n", 1)[1].startswith(
        b'{"detail":"request body not received within 0.5 s"'
    )
    assert httpx.get(live_server + "/api/v1/runs/full", timeout=30).status_code == 404

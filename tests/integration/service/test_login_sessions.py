"""Server-side login sessions: the cookie names a row that /logout deletes; expired sessions are
refused and pruned; two replicas on one database agree (SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from memest.service.models import LoginSession
from memest.service.sessions import SESSION_COOKIE, SessionStore
from tests.integration.service.conftest import MakeClient

READ = "test-read-token-0"
TWELVE_HOURS_S = 12 * 60 * 60


def _log_in(client: TestClient, token: str = READ) -> str:
    r = client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    cookie = r.cookies[SESSION_COOKIE]
    assert cookie
    return cookie


def _reads(client: TestClient, cookie: str) -> int:
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, cookie)
    try:
        return client.get("/api/v1/models").status_code
    finally:
        client.cookies.clear()


def _rows(client: TestClient) -> list[LoginSession]:
    with client.app.state.sessionmaker() as db:  # type: ignore[attr-defined]
        return list(db.scalars(select(LoginSession)))


def test_logout_revokes_the_old_cookie(make_client: MakeClient, db_url: str) -> None:
    client = make_client(read_token=READ, database_url=db_url)
    cookie = _log_in(client)
    assert _reads(client, cookie) == 200
    client.cookies.set(SESSION_COOKIE, cookie)
    out = client.post("/logout", follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert _rows(client) == []
    # A copy of the cookie kept from before logout no longer reads.
    assert _reads(client, cookie) == 401


def test_the_database_keeps_only_the_hash_of_a_random_id(make_client: MakeClient) -> None:
    client = make_client(read_token=READ)
    first, second = _log_in(client), _log_in(client)
    assert first != second and READ not in first
    rows = _rows(client)
    assert {r.id_sha256 for r in rows} == {
        hashlib.sha256(c.encode()).hexdigest() for c in (first, second)
    }
    assert all(r.expires_at_s - r.created_at_s == TWELVE_HOURS_S for r in rows)
    assert _reads(client, "made-up-" + first[8:]) == 401


def test_cookie_flags_follow_the_scheme(make_client: MakeClient) -> None:
    client = make_client(read_token=READ)
    r = client.post("/login", data={"token": READ, "next": "/"}, follow_redirects=False)
    flags = [f.strip().lower() for f in r.headers["set-cookie"].split(";")]
    assert "httponly" in flags and "samesite=strict" in flags and "path=/" in flags
    assert f"max-age={TWELVE_HOURS_S}" in flags and "secure" not in flags
    https = TestClient(client.app, base_url="https://testserver")
    r = https.post("/login", data={"token": READ, "next": "/"}, follow_redirects=False)
    assert "secure" in [f.strip().lower() for f in r.headers["set-cookie"].split(";")]


def test_two_replicas_on_one_database_agree(make_client: MakeClient, db_url: str) -> None:
    one = make_client(read_token=READ, database_url=db_url)
    two = make_client(read_token=READ, database_url=db_url)
    cookie = _log_in(one)
    assert _reads(two, cookie) == 200
    two.cookies.set(SESSION_COOKIE, cookie)
    assert two.post("/logout", follow_redirects=False).status_code == 303
    assert _reads(one, cookie) == 401
    assert _reads(two, cookie) == 401


def test_expired_sessions_are_refused_and_pruned(make_client: MakeClient, db_url: str) -> None:
    client = make_client(read_token=READ, database_url=db_url)
    now = [1_000_000.0]
    client.app.state.login_sessions = SessionStore(  # type: ignore[attr-defined]
        client.app.state.sessionmaker,  # type: ignore[attr-defined]
        clock=lambda: now[0],
    )
    old, other = _log_in(client), _log_in(client)
    now[0] += TWELVE_HOURS_S - 1
    assert _reads(client, old) == 200
    now[0] += 1  # twelve hours after login
    assert _reads(client, old) == 401
    assert len(_rows(client)) == 1  # the refused one is gone; `other` waits for the next login
    fresh = _log_in(client)
    assert [r.id_sha256 for r in _rows(client)] == [hashlib.sha256(fresh.encode()).hexdigest()]
    assert _reads(client, other) == 401 and _reads(client, fresh) == 200


def test_a_new_token_ends_the_sessions_of_the_old(make_client: MakeClient, db_url: str) -> None:
    before = make_client(read_token=READ, database_url=db_url)
    cookie = _log_in(before)
    after = make_client(read_token="rotated-read-token", database_url=db_url)
    assert _reads(after, cookie) == 401


@pytest.mark.parametrize("cookie", ["", "x" * 5000, "%00%FF"])
def test_odd_cookies_are_refused_not_errors(make_client: MakeClient, cookie: str) -> None:
    client = make_client(read_token=READ)
    client.cookies.set(SESSION_COOKIE, cookie)
    assert client.get("/api/v1/models").status_code == 401
    assert client.post("/logout", follow_redirects=False).status_code == 303

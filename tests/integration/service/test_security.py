"""Headers, links, the read token in a browser (login), and deleting runs."""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient
from markupsafe import escape

from memest.cli import main
from memest.demo import demo_report
from memest.reporters.views import model_name
from memest.service.middleware import CONTENT_SECURITY_POLICY
from tests.integration.service.conftest import AUTH, TOKEN, MakeClient

READ = "test-read-token-0"
DS_PR = "demo-deepseek-v4-flash-dspark-k7-pr"


def _report(model: str, tag: str) -> str:
    data = json.loads(demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json())
    data.update(report_id=f"sec-{tag}-r0", run_id=f"sec-{tag}", model=model, source="synthetic")
    data["config"]["model"] = model
    return json.dumps(data)


def test_every_response_carries_the_security_headers(demo_client: TestClient) -> None:
    for path in ("/", "/api/v1/models", "/static/memest.css", "/no-such-page", "/healthz"):
        r = demo_client.get(path)
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert r.headers["referrer-policy"] == "no-referrer", path


def test_pages_use_only_what_the_policy_allows(demo_client: TestClient) -> None:
    # style-src 'self' and script-src 'self': no inline style attribute, script or handler.
    model = quote("deepseek-ai/DeepSeek-V4-Flash-DSpark", safe="")
    for path in ("/", f"/models/{model}", f"/history/{model}", "/docs", "/login"):
        html = demo_client.get(path).text
        assert " style=" not in html and "<style" not in html, path
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
        assert not re.search(r"\son[a-z]+=", html), path


def test_the_host_header_never_reaches_a_page(demo_client: TestClient) -> None:
    model = quote("deepseek-ai/DeepSeek-V4-Flash-DSpark", safe="")
    for path in ("/", f"/models/{model}", "/docs", "/api/v1/runs/"):
        r = demo_client.get(path, headers={"Host": "evil.example"})
        assert "evil.example" not in r.text and "evil.example" not in r.headers.get(
            "location", ""
        ), path
    assert 'href="/static/memest.css"' in demo_client.get("/").text


@pytest.mark.parametrize("model", ["org/m#v2", "org/m?x", "org/m%41", "org/a b", "org/../m"])
def test_dashboard_links_reach_models_with_url_characters(live_server: str, model: str) -> None:
    # A real server: TestClient decodes a path twice, which would hide the %41 case.
    with httpx.Client(base_url=live_server, timeout=30) as client:
        r = client.post(
            "/api/v1/reports",
            content=_report(model, "links"),
            headers={"Content-Type": "application/json", **AUTH},
        )
        assert r.status_code == 201, r.text
        links = re.findall(r'href="(/(?:models|history)/[^"]*)"', client.get("/").text)
        assert len(links) == 3  # model page, history, the run on the model page
        for link in links:
            page = client.get(link.replace("&amp;", "&"))
            assert page.status_code == 200, (link, page.text[:200])
            assert str(escape(model_name(model))) in page.text  # as pages name it (title included)


def test_read_token_guards_the_openapi_document(make_client: MakeClient) -> None:
    client = make_client(read_token=READ)
    assert client.get("/openapi.json").status_code == 401
    assert client.get("/docs", headers={"Accept": "application/json"}).status_code == 401
    ok = client.get("/openapi.json", headers={"Authorization": f"Bearer {READ}"})
    assert ok.status_code == 200 and "/api/v1/reports" in ok.json()["paths"]


def test_a_browser_logs_in_to_read_the_dashboard(make_client: MakeClient) -> None:
    client = make_client(read_token=READ, demo=True)
    html = {"Accept": "text/html"}
    # A browser without a session is sent to the form, with the way back.
    first = client.get("/models/x?run=y", headers=html, follow_redirects=False)
    assert first.status_code == 303
    assert first.headers["location"] == "/login?next=" + quote("/models/x?run=y", safe="")
    assert client.get("/api/v1/models").status_code == 401  # an API client gets a 401
    wrong = client.post("/login", data={"token": "nope", "next": "/"}, follow_redirects=False)
    assert wrong.status_code == 401 and "not the server" in wrong.text
    assert "memest_session" not in wrong.cookies
    ok = client.post("/login", data={"token": READ, "next": "/docs"}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/docs"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and READ not in cookie
    assert client.get("/", headers=html).status_code == 200
    assert client.get("/api/v1/models").status_code == 200
    # The session reads; it never writes.
    assert client.delete(f"/api/v1/runs/{DS_PR}").status_code == 401
    client.post("/logout")
    assert client.get("/api/v1/models").status_code == 401


@pytest.mark.parametrize(
    "target", ["//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:x"]
)
def test_login_never_redirects_off_site(make_client: MakeClient, target: str) -> None:
    client = make_client(read_token=READ)
    r = client.post("/login", data={"token": READ, "next": target}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"


def test_delete_a_run_then_store_its_ids_again(client: TestClient) -> None:
    body = _report("org/m", "del")
    headers = {"Content-Type": "application/json", **AUTH}
    assert client.post("/api/v1/reports", content=body, headers=headers).status_code == 201
    assert client.get("/api/v1/runs/sec-del/breakdown").status_code == 200  # now cached
    assert client.delete("/api/v1/runs/sec-del").status_code == 401
    gone = client.delete("/api/v1/runs/sec-del", headers=AUTH)
    assert gone.json() == {"status": "deleted", "run_id": "sec-del", "report_ids": ["sec-del-r0"]}
    for path in (
        "/api/v1/runs/sec-del",
        "/api/v1/runs/sec-del/breakdown",
        "/api/v1/reports/sec-del-r0",
    ):
        assert client.get(path).status_code == 404, path
    assert client.delete("/api/v1/runs/sec-del", headers=AUTH).status_code == 404
    # The same ids with other content are a new run, not a conflict with the deleted one.
    other = json.loads(body)
    other["build"]["label"] = "other"
    again = client.post("/api/v1/reports", content=json.dumps(other), headers=headers)
    assert again.status_code == 201
    assert client.get("/api/v1/runs/sec-del/breakdown").json()["build"] == "other"


def test_memest_delete_command(live_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    httpx.post(
        live_server + "/api/v1/reports",
        content=_report("org/m", "cli"),
        headers={"Content-Type": "application/json", **AUTH},
    ).raise_for_status()
    args = ["delete", "sec-cli", "--url", live_server]
    assert main([*args, "--token", "wrong"]) == 1
    assert "HTTP 401" in capsys.readouterr().out
    assert main([*args, "--token", TOKEN]) == 0
    assert "sec-cli: deleted (1 report(s))" in capsys.readouterr().out
    assert main([*args, "--token", TOKEN]) == 1
    assert "HTTP 404" in capsys.readouterr().out
    assert httpx.get(live_server + "/api/v1/runs/sec-cli").status_code == 404


def test_failed_logins_from_one_address_are_limited(make_client: MakeClient) -> None:
    from memest.service.ratelimit import FAILURE_WINDOW_S as LOGIN_WINDOW_S
    from memest.service.ratelimit import MAX_FAILURES as LOGIN_FAILURES
    from memest.service.ratelimit import FailureLimiter

    client = make_client(read_token=READ)
    now = [1000.0]
    client.app.state.failure_limiter = FailureLimiter(clock=lambda: now[0])  # type: ignore[attr-defined]

    def attempt(token: str) -> httpx.Response:
        return client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)

    for _ in range(LOGIN_FAILURES):
        assert attempt("nope").status_code == 401
    # The next try, even with the right token, waits out the window of the first failure.
    now[0] += 10
    limited = attempt(READ)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == str(int(LOGIN_WINDOW_S) - 10)
    assert limited.json()["detail"].startswith("too many failed logins")
    now[0] += LOGIN_WINDOW_S - 10
    assert attempt(READ).status_code == 303

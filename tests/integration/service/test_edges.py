"""The service's edges, one limit per test: token scopes and lengths, the per-client failure
limit and proxy trust, the login body's deadline, connections per client, the calculators'
input limits, worker pool and deadline, the one body edge, readiness apart from liveness, and
PostgreSQL's delete races. No test asserts a duration."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

from memest.demo.h200 import h200_reports
from memest.service import create_app, limits
from memest.service.compute import ComputePool
from memest.service.config import MIN_TOKEN_CHARS, Settings
from memest.service.errors import DeadlineExceeded, Unavailable
from memest.service.examples import PREFLIGHT_REQUEST
from memest.service.server import uvicorn_config
from tests.integration.service.conftest import AUTH, TOKEN, MakeClient
from tests.integration.service.slow_calc import sleep_then_answer
from tests.live_server import free_port, run_server

PUSH = "test-push-token-0"
READ = "test-read-token-0"
JSON = {"Content-Type": "application/json"}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **JSON}


def _report(**changes: Any) -> dict[str, Any]:
    """A complete real start (H200) with fresh ids, then ``changes``."""
    data: dict[str, Any] = json.loads(h200_reports()[0].model_dump_json())
    tag = uuid.uuid4().hex[:10]
    data.update({"report_id": f"edge-{tag}-r0", "run_id": f"edge-{tag}", "source": "synthetic"})
    data.update(changes)
    return data


def _stages(data: dict[str, Any], n: int) -> dict[str, Any]:
    bd = data["breakdown"]
    bd["stages"] = [{"stage": f"s{i}", "pool_growth_bytes": 1 << 20} for i in range(n)]
    bd["graph_pool_growth_bytes"] = n << 20
    return data


# --- tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["write_token", "push_token", "read_token"])
def test_a_short_token_is_refused_at_startup(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}[\\s\\S]*at least {MIN_TOKEN_CHARS}"):
        Settings(**{field: "x" * (MIN_TOKEN_CHARS - 1)})  # type: ignore[arg-type]
    assert Settings(**{field: "x" * MIN_TOKEN_CHARS}) is not None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "token",
    [" " * 24, "\t" * 20, "a-token-\x07-with-a-bell", "a-token-\twith-a-tab", "é" * 20],
)
def test_a_token_no_header_can_carry_is_refused_at_startup(token: str) -> None:
    """Spaces only, or a control or non-ASCII character inside: no Authorization header would
    match it, so the server would refuse every client without saying why."""
    with pytest.raises(ValueError, match="write_token"):
        Settings(write_token=token)  # type: ignore[arg-type]


def test_a_tokens_surrounding_whitespace_is_dropped(make_client: MakeClient) -> None:
    """A Secret made from a file holds its trailing newline; the header's token has none."""
    client = make_client(write_token=f"  {TOKEN}\n")
    answer = client.post("/api/v1/reports", json=_report(), headers=AUTH)
    assert answer.status_code == 201, answer.text


def test_memest_serve_names_the_short_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memest.cli import main

    monkeypatch.setenv("MEMEST_WRITE_TOKEN", "short")
    assert main(["serve", "--exit-after-load", "--database-url", "sqlite://"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        f"memest serve: MEMEST_WRITE_TOKEN: Value error, a token must be at least "
        f"{MIN_TOKEN_CHARS} characters"
    )


def test_each_token_does_what_its_scope_allows(make_client: MakeClient, db_url: str) -> None:
    client = make_client(database_url=db_url, push_token=PUSH, read_token=READ)
    data = _report()
    # The push token stores a report, and nothing else.
    assert client.post("/api/v1/reports", json=data, headers=_bearer(PUSH)).status_code == 201
    run = f"/api/v1/runs/{data['run_id']}"
    assert client.get(run, headers=_bearer(PUSH)).status_code == 403
    assert client.delete(run, headers=_bearer(PUSH)).status_code == 403
    login = client.post("/login", data={"token": PUSH}, follow_redirects=False)
    assert login.status_code == 401
    # The read token reads, and neither pushes nor deletes.
    assert client.get(run, headers=_bearer(READ)).status_code == 200
    second = _report()
    assert client.post("/api/v1/reports", json=second, headers=_bearer(READ)).status_code == 403
    assert client.delete(run, headers=_bearer(READ)).status_code == 403
    # The admin token does all three.
    assert client.post("/api/v1/reports", json=second, headers=AUTH).status_code == 201
    assert client.get(run, headers=AUTH).status_code == 200
    assert client.delete(run, headers=AUTH).status_code == 200


def test_a_refused_client_gets_its_body_refused_unparsed(client: TestClient) -> None:
    # Not JSON at all: a client without a token hears 401, never what is wrong with its body.
    answer = client.post("/api/v1/reports", content=b"{not json", headers=JSON)
    assert answer.status_code == 401


# --- failures per client, proxy trust -------------------------------------------------------


def test_bearer_guesses_are_limited_per_client(make_client: MakeClient) -> None:
    from memest.service.ratelimit import MAX_FAILURES

    client = make_client(read_token=READ)
    for i in range(MAX_FAILURES):
        # A rotated X-Forwarded-For is ignored: no proxy is trusted by default.
        headers = {**_bearer(f"guess-{i:012d}"), "X-Forwarded-For": f"10.0.0.{i}"}
        assert client.get("/api/v1/models", headers=headers).status_code == 401
    limited = client.get("/api/v1/models", headers={**_bearer(READ), "X-Forwarded-For": "10.9.9.9"})
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) > 0
    # The same limit holds at the login form.
    login = client.post("/login", data={"token": READ}, follow_redirects=False)
    assert login.status_code == 429


def test_a_trusted_proxy_forwards_each_clients_address(make_client: MakeClient) -> None:
    from memest.service.ratelimit import MAX_FAILURES

    # TestClient's peer is "testclient"; trusting it, each forwarded address is its own client.
    client = make_client(read_token=READ, forwarded_allow_ips="testclient")
    for _ in range(MAX_FAILURES):
        guess = {**_bearer("guess-000000000000"), "X-Forwarded-For": "10.0.0.1"}
        assert client.get("/api/v1/models", headers=guess).status_code == 401
    other = {**_bearer(READ), "X-Forwarded-For": "10.0.0.2"}
    assert client.get("/api/v1/models", headers=other).status_code == 200
    again = {**_bearer(READ), "X-Forwarded-For": "10.0.0.1"}
    assert client.get("/api/v1/models", headers=again).status_code == 429


# --- bodies and connections on a live server ------------------------------------------------


@pytest.fixture
def live(sqlite_url: str) -> Iterator[tuple[str, int]]:
    """memest serve's uvicorn configuration (read limits included), on loopback."""
    settings = Settings(  # type: ignore[call-arg]
        database_url=sqlite_url,
        write_token=TOKEN,
        read_token=READ,
        max_connections_per_client=3,
    )
    port = free_port()
    config = uvicorn_config(
        create_app(settings), settings, host="127.0.0.1", port=port, log_level="warning"
    )
    with run_server(config, start_timeout_s=15) as url:
        yield url, port


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_trickled_login_form_is_cut_off(
    live: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from memest.service.routers import login

    monkeypatch.setattr(login, "LOGIN_BODY_TIMEOUT_S", 0.5)
    _, port = live
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /login HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-www-form-urlencoded"
            b"\r\nContent-Length: 100\r\nConnection: close\r\n\r\ntoken="
        )
        answer = _answer(sock)  # the rest never comes; the server answers without it
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"408"
    assert b"login form not received within 0.5 s" in answer


def test_connections_per_client_are_capped(live: tuple[str, int]) -> None:
    url, port = live
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3)]
    try:
        for sock in held:  # each held open by a request head that has not ended
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as extra:
            answer = _answer(extra)  # answered at once, before any request is read
        assert answer.split(b"\r\n", 1)[0].split()[1] == b"503"
        assert b"too many open connections from this address" in answer
    finally:
        for sock in held:
            sock.close()
    # Once they are closed, the client is served again.
    for _ in range(50):
        try:
            if httpx.get(url + "/healthz", timeout=10).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    assert httpx.get(url + "/healthz", timeout=10).status_code == 200


# --- calculators: input limits --------------------------------------------------------------


def _preflight(**config: Any) -> dict[str, Any]:
    body = deepcopy(PREFLIGHT_REQUEST)
    body["model_config"].update(config)
    return body


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"num_hidden_layers": limits.MAX_LAYERS + 1}, "model_config.num_hidden_layers"),
        ({"num_hidden_layers": 10**5}, "model_config.num_hidden_layers"),
        ({"num_local_experts": limits.MAX_EXPERTS + 1}, "model_config.num_local_experts"),
        (
            {"text_config": {"num_hidden_layers": limits.MAX_LAYERS + 1}},
            "model_config.text_config.num_hidden_layers",
        ),
    ],
)
def test_preflight_refuses_a_model_past_the_limits(
    client: TestClient, config: dict[str, Any], field: str
) -> None:
    answer = client.post("/api/v1/preflight", json=_preflight(**config))
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert "the service takes at most" in answer.json()["detail"]


def test_preflight_refuses_too_many_capture_sizes(client: TestClient) -> None:
    body = _preflight()
    sizes = list(range(1, limits.MAX_CAPTURE_SIZES + 2))
    body["compilation_config"] = {"cudagraph_capture_sizes": sizes}
    answer = client.post("/api/v1/preflight", json=body)
    assert answer.status_code == 422
    assert answer.json()["field"] == "compilation_config.cudagraph_capture_sizes"


def test_what_if_refuses_a_report_past_the_stage_limit(client: TestClient) -> None:
    report = _stages(_report(), limits.MAX_STAGES + 1)
    body = {"report": report, "plan": report["capture_plans"][0]}
    answer = client.post("/api/v1/what-if", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "report.breakdown.stages"


def test_what_if_refuses_a_plan_past_the_runner_limit(client: TestClient) -> None:
    report = _report()
    plan = deepcopy(report["capture_plans"][0])
    plan["runners"] = [plan["runners"][0]] * (limits.MAX_RUNNERS + 1)
    answer = client.post("/api/v1/what-if", json={"report": report, "plan": plan})
    assert answer.status_code == 422
    assert answer.json()["field"] == "plan.runners"


def test_a_stored_run_past_the_limits_is_not_estimated(
    make_client: MakeClient, db_url: str
) -> None:
    client = make_client(database_url=db_url)
    data = _stages(_report(), limits.MAX_STAGES + 1)
    assert client.post("/api/v1/reports", json=data, headers=AUTH).status_code == 201
    answer = client.post(f"/api/v1/runs/{data['run_id']}/estimate", json={})
    assert answer.status_code == 422
    assert answer.json()["field"] == "breakdown.stages"


def test_the_calculators_answer_within_the_limits(client: TestClient) -> None:
    report = _report()
    assert client.post("/api/v1/preflight", json=PREFLIGHT_REQUEST).status_code == 200
    what_if = client.post(
        "/api/v1/what-if", json={"report": report, "plan": report["capture_plans"][0]}
    )
    assert what_if.status_code == 200, what_if.text
    assert "kv_budget_bytes_to" in what_if.json() or what_if.json()


@pytest.mark.parametrize(
    ("config", "field"),
    [
        # 2^20 as the widest graph resolves to about 70,000 capture sizes (a 1.4 MB answer).
        ({"max_cudagraph_capture_size": 1 << 20}, "compilation_config"),
        (
            {"cudagraph_capture_sizes": [8] * (limits.MAX_CAPTURE_SIZES + 1)},
            "compilation_config.cudagraph_capture_sizes",
        ),
    ],
)
def test_the_plan_refuses_a_grid_past_the_capture_size_limit(
    client: TestClient, config: dict[str, Any], field: str
) -> None:
    answer = client.get("/api/v1/plan", params={"compilation_config": json.dumps(config)})
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    assert f"at most {limits.MAX_CAPTURE_SIZES}" in answer.json()["detail"]


def test_the_plan_is_computed_in_a_calculator_worker(make_client: MakeClient) -> None:
    """GET /api/v1/plan goes through the worker pool: past its deadline it is a 503/504 naming
    the setting, like the other calculators, and within it the plan."""
    slow = make_client(compute_deadline_s=0.001)
    answer = slow.get("/api/v1/plan")
    assert answer.status_code in (503, 504), answer.text
    assert "MEMEST_COMPUTE" in answer.json()["detail"]
    plan = make_client().get("/api/v1/plan", params={"sizing": "vllm-0.33.0"})
    assert plan.status_code == 200, plan.text
    assert plan.json()["runners"]


# --- the worker pool ------------------------------------------------------------------------


def test_a_computation_past_the_deadline_is_stopped_with_a_504() -> None:
    pool = ComputePool(workers=1, deadline_s=5.0)

    async def run() -> None:
        with pytest.raises(DeadlineExceeded):
            await pool.run(sleep_then_answer, 60.0)
        # The killed worker was replaced: the next request is answered.
        assert await pool.run(sleep_then_answer, 0.0) == b"{}"

    try:
        anyio.run(run)
    finally:
        pool.shutdown()


def test_a_worker_yields_the_cpu_to_the_event_loop() -> None:
    """Calculator workers run at a lower CPU priority than the server (its event loop)."""
    import os

    from memest.service.compute import WORKER_NICENESS
    from tests.integration.service.slow_calc import niceness

    pool = ComputePool(workers=1, deadline_s=30.0)
    try:
        answer = anyio.run(pool.run, niceness)
    finally:
        pool.shutdown()
    assert int(answer) == min(os.nice(0) + WORKER_NICENESS, 19)


def test_no_free_worker_within_the_deadline_is_a_503() -> None:
    pool = ComputePool(workers=1, deadline_s=4.0)
    outcomes: list[BaseException | bytes] = []

    async def one(seconds: float) -> None:
        try:
            outcomes.append(await pool.run(sleep_then_answer, seconds))
        except (DeadlineExceeded, Unavailable) as exc:
            outcomes.append(exc)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 60.0)  # holds the only worker until its deadline
            await anyio.sleep(0.2)
            tg.start_soon(one, 0.0)

    try:
        anyio.run(run)
    finally:
        pool.shutdown()
    kinds = sorted(type(o).__name__ for o in outcomes)
    assert kinds == ["DeadlineExceeded", "Unavailable"], outcomes
    busy = next(o for o in outcomes if isinstance(o, Unavailable))
    assert busy.retry_after_s >= 1


def test_the_deadline_answers_are_json_naming_the_setting(make_client: MakeClient) -> None:
    # A deadline shorter than a worker's start: the pre-flight cannot finish in time.
    client = make_client(compute_deadline_s=0.001)
    answer = client.post("/api/v1/preflight", json=PREFLIGHT_REQUEST)
    assert answer.status_code in (503, 504)
    assert "MEMEST_COMPUTE" in answer.json()["detail"]


# --- the one body edge ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"report": {"x": NaN}, "plan": {}}', "body"),
        ('{"report": ' + '{"k": ' * 70 + "1" + "}" * 70 + ', "plan": {}}', "report.k.k"),
        ('{"report": {"x": 99999999999999999999}, "plan": {}}', "report.x"),
    ],
)
def test_the_what_if_body_meets_the_json_limits(client: TestClient, text: str, field: str) -> None:
    answer = client.post("/api/v1/what-if", content=text.encode(), headers=JSON)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"].startswith(field)


def test_the_what_if_report_must_be_of_this_schema_version(client: TestClient) -> None:
    report = _report(schema_version="2")
    answer = client.post("/api/v1/what-if", json={"report": report, "plan": {}})
    assert answer.status_code == 422
    assert answer.json()["field"] == "report.schema_version"


def test_every_body_is_typed_in_the_openapi_document(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    bodies = {
        (path, method): op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
    }
    assert bodies == {
        ("/api/v1/reports", "post"): "#/components/schemas/RunReport",
        ("/api/v1/estimate", "post"): "#/components/schemas/RunReport",
        ("/api/v1/what-if", "post"): "#/components/schemas/WhatIfRequest",
        ("/api/v1/preflight", "post"): "#/components/schemas/PreflightRequest",
        ("/api/v1/runs/{run_id}/estimate", "post"): "#/components/schemas/RunEstimateRequest",
    }
    inverse = spec["components"]["schemas"]["RunEstimateResponse"]["properties"]["inverse"]
    assert "$ref" in json.dumps(inverse), inverse


# --- liveness and readiness -----------------------------------------------------------------


def test_a_database_outage_fails_readiness_not_liveness(client: TestClient) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    assert client.get("/readyz").status_code == 200
    gone = create_engine(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none")
    client.app.state.sessionmaker = sessionmaker(bind=gone)  # type: ignore[attr-defined]
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["detail"].startswith("database: OperationalError")
    assert client.get("/healthz").json() == {"status": "ok"}


def test_liveness_is_answered_ahead_of_the_app(make_client: MakeClient) -> None:
    """/healthz is answered by the outermost layer: open with a read token set, with the
    security headers, ahead of every other layer."""
    client = make_client(read_token=READ)
    answer = client.get("/healthz")
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert client.head("/healthz").status_code == 200
    assert client.get("/api/v1/models").status_code == 401  # the rest still needs the token
    # A head past its limit is refused on liveness too (a kubelet's probe sends a few hundred
    # bytes; a head that large is not a probe).
    big = {"x-filler": "a" * 20_000}
    assert client.get("/readyz", headers=big).status_code == 431
    assert client.get("/healthz", headers=big).status_code == 431


# --- paths and names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/models/a%0Ab", "/models/a%0Ab/history", "/api/v1/models/a%0Ab", "/runs/a%0D"]
)
def test_a_path_with_a_control_character_is_a_clean_404(client: TestClient, path: str) -> None:
    """A browser gets the not-found page on a dashboard path; an API client JSON naming it."""
    answer = client.get(path, headers={"Accept": "text/html"})
    assert answer.status_code == 404
    if path.startswith("/api/"):
        assert answer.json()["field"] == "path"
    else:
        assert "<h1>Not found</h1>" in answer.text and "a\n" not in answer.text
        assert client.get(path).json()["field"] == "path"


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "a\x85b", "a\x9b31mb", "a\u2028b", "a\u2029b"])
def test_a_model_name_with_a_newline_is_not_stored(client: TestClient, name: str) -> None:
    """ASCII newlines and controls, NEL and the other C1 controls, the Unicode line and paragraph
    separators."""
    answer = client.post("/api/v1/reports", json=_report(model=name), headers=AUTH)
    assert answer.status_code == 422
    assert answer.json() == {"detail": "model contains a control character", "field": "model"}


# --- PostgreSQL (and SQLite) delete races ---------------------------------------------------


@pytest.fixture
def live_db(db_url: str) -> Iterator[str]:
    settings = Settings(database_url=db_url, write_token=TOKEN)  # type: ignore[call-arg]
    port = free_port()
    config = uvicorn_config(
        create_app(settings), settings, host="127.0.0.1", port=port, log_level="warning"
    )
    with run_server(config, start_timeout_s=15) as url:
        yield url


def test_concurrent_deletes_of_one_run_one_wins(live_db: str) -> None:
    with httpx.Client(base_url=live_db, timeout=60) as http:
        for _ in range(5):
            data = _report()
            assert http.post("/api/v1/reports", json=data, headers=AUTH).status_code == 201
            start = threading.Barrier(8)
            target = f"{live_db}/api/v1/runs/{data['run_id']}"

            def delete(_: int, target: str = target, start: threading.Barrier = start) -> int:
                start.wait()
                return httpx.delete(target, headers=AUTH).status_code

            with ThreadPoolExecutor(8) as pool:
                codes = sorted(pool.map(delete, range(8)))
            assert codes == [200] + [404] * 7


def test_reads_racing_a_delete_answer_the_run_or_404(live_db: str) -> None:
    seen: set[int] = set()
    with httpx.Client(base_url=live_db, timeout=60) as http:
        for _ in range(10):
            data = _report()
            run = f"/api/v1/runs/{data['run_id']}"
            assert http.post("/api/v1/reports", json=data, headers=AUTH).status_code == 201
            paths = [run, f"{run}/breakdown", f"{run}/ranks/0", "/api/v1/runs"]

            def read(i: int, paths: list[str] = paths) -> int:
                return httpx.get(live_db + paths[i % len(paths)], timeout=60).status_code

            with ThreadPoolExecutor(8) as pool:
                reads = pool.map(read, range(24))
                assert http.delete(run, headers=AUTH).status_code == 200
                seen.update(reads)
    assert seen <= {200, 404}, seen


def test_pages_racing_a_delete_answer_the_page_or_404(live_db: str) -> None:
    """The dashboard's pages read a run that a DELETE removes meanwhile: the old page or a 404
    (a browser's not-found page), never a 500."""
    seen: set[int] = set()
    with httpx.Client(base_url=live_db, timeout=60) as http:
        base = _report()
        assert http.post("/api/v1/reports", json=base, headers=AUTH).status_code == 201
        model = quote(base["model"], safe="")
        for _ in range(10):
            data = _report()
            run = data["run_id"]
            assert http.post("/api/v1/reports", json=data, headers=AUTH).status_code == 201
            paths = [
                f"/models/{model}",  # the newest run: the one being deleted
                f"/models/{model}?run={run}",
                f"/compare?a={base['run_id']}&b={run}",
                f"/history/{model}",
            ]

            def read(i: int, paths: list[str] = paths) -> int:
                page = httpx.get(live_db + paths[i % len(paths)], timeout=60)
                return page.status_code

            with ThreadPoolExecutor(8) as pool:
                reads = pool.map(read, range(30))
                assert http.delete(f"/api/v1/runs/{run}", headers=AUTH).status_code == 200
                seen.update(reads)
    assert seen <= {200, 404}, seen


@pytest.mark.parametrize("shown", ["newest", "named"])
def test_a_delete_between_a_pages_reads_leaves_the_old_page(
    db_url: str, monkeypatch: pytest.MonkeyPatch, shown: str
) -> None:
    """The run is deleted (and committed) right after the model page has listed the model's
    runs: the page's reads share one snapshot, so it shows the run as it was, not a 500."""
    from memest.service import store

    client = TestClient(create_app(Settings(database_url=db_url, write_token=TOKEN)))  # type: ignore[call-arg]
    with client:
        data = _report()
        assert client.post("/api/v1/reports", json=data, headers=AUTH).status_code == 201
        listed = store.model_runs
        factory = client.app.state.sessionmaker  # type: ignore[attr-defined]

        def list_then_delete(session: Any, model: str) -> Any:
            runs = listed(session, model)
            store.delete_run(factory, data["run_id"])
            return runs

        monkeypatch.setattr(store, "model_runs", list_then_delete)
        query = "" if shown == "newest" else f"?run={data['run_id']}"
        page = client.get(f"/models/{quote(data['model'], safe='')}{query}")
        assert page.status_code == 200, page.text
        assert data["run_id"] in page.text
        monkeypatch.setattr(store, "model_runs", listed)
        assert client.get(f"/api/v1/runs/{data['run_id']}").status_code == 404

"""Hostile input against every route, on SQLite and on PostgreSQL: never a 5xx, and every read
still answers 200 afterwards (nothing stored that later breaks a page, the API or /metrics).

Each case is one request; the app (demo data loaded) lives for the module, so later cases meet
what earlier ones managed to store, as a real server would.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from memest.demo import demo_report
from memest.service import create_app
from memest.service.config import Settings
from tests.integration.service.conftest import AUTH, TOKEN, pg_schema
from tests.live_server import serve

DS_MAIN = "demo-deepseek-v4-flash-dspark-k7-main"
DS_PR = "demo-deepseek-v4-flash-dspark-k7-pr"
BIG = 2**62  # three of these pass int64 once summed
JSON_HEADERS = {"Content-Type": "application/json", **AUTH}


def _base() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json())
    data["source"] = "synthetic"
    return data


def _fresh(**changes: Any) -> dict[str, Any]:
    """A valid report with new ids, then ``changes`` (dotted keys reach into nested objects)."""
    data = _base()
    tag = uuid.uuid4().hex[:10]
    data.update({"report_id": f"hostile-{tag}-r0", "run_id": f"hostile-{tag}"})
    for key, value in changes.items():
        *parents, last = key.split("__")
        target = data
        for p in parents:
            target = target[p]
        target[last] = value
    return data


def _nested(depth: int) -> str:
    """JSON text of objects nested ``depth`` levels (json.dumps itself stops near 1,000)."""
    return '{"k": ' * depth + "1" + "}" * depth


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: Callable[[], bytes | str] | None = None
    headers: dict[str, str | bytes] | None = None


def _post(name: str, body: Callable[[], bytes | str], path: str = "/api/v1/reports") -> Case:
    return Case(name, "POST", path, body, JSON_HEADERS)


def _json(**changes: Any) -> Callable[[], str]:
    return lambda: json.dumps(_fresh(**changes))


def _text(make: Callable[[str], str]) -> Callable[[], str]:
    """A report whose JSON text is edited after encoding (for what json.dumps cannot write)."""
    return lambda: make(json.dumps(_fresh()))


def _stages_summing_past_int64() -> str:
    data = _fresh()
    stages = data["breakdown"]["stages"]
    for s in stages:
        s["pool_growth_bytes"] = BIG
    data["breakdown"]["graph_pool_growth_bytes"] = 0
    while len(stages) < 3:
        stages.append(dict(stages[0], stage=f"extra.{len(stages)}"))
    return json.dumps(data)


def _write_cases() -> list[Case]:
    return _shape_cases() + _value_cases()


def _shape_cases() -> list[Case]:
    """Bodies whose structure is hostile: nesting, huge integers, surrogates."""
    cases: list[Case] = []
    for depth in (65, 100, 300, 1000, 5000):
        cases.append(
            _post(
                f"config-nested-{depth}",
                _text(lambda t, d=depth: _set_raw(t, "config__compilation_config", _nested(d))),
            )
        )
    for depth in (70, 400):
        cases.append(
            _post(f"list-nested-{depth}", _json(notes=json.loads("[" * depth + "]" * depth)))
        )
    for text in ("[" * 100000, "{" * 100000, '{"a":' * 100000, "[" * 1000 + "]" * 1000):
        cases.append(_post(f"brackets-{len(text)}-{text[:2]}", lambda t=text: t))
    digits = "9" * 5000
    for field in ("rank", "world_size", "config__max_num_seqs", "breakdown__event_count"):
        cases.append(
            _post(f"int-5000-digits-{field}", _text(lambda t, f=field: _set_raw(t, f, digits)))
        )
        cases.append(_post(f"int-past-int64-{field}", _json(**{field: 2**63})))
        cases.append(_post(f"int-below-int64-{field}", _json(**{field: -(2**63) - 1})))
    cases.append(_post("int-past-int64-in-config", _json(config__compilation_config={"x": 2**70})))
    cases.append(_post("sizes-sum-past-int64", _stages_summing_past_int64))
    cases.append(_post("int64-max-sizes", _json(breakdown__graph_pool_growth_bytes=2**63 - 1)))
    for field in ("model", "build__label", "notes", "gpu__name", "report_id"):
        value: Any = ["a\ud800b"] if field == "notes" else "a\ud800b"
        cases.append(_post(f"lone-surrogate-{field}", _json(**{field: value})))
    cases.append(_post("lone-surrogate-key", _json(config__compilation_config={"\udc80": 1})))
    cases.append(_post("invalid-utf8", lambda: json.dumps(_fresh()).encode()[:-2] + b'\xff"}'))
    return cases


def _value_cases() -> list[Case]:
    """Bodies whose values are hostile: dates, non-finite numbers, and the rest."""
    cases: list[Case] = []
    for stamp in (
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00+23:59",
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2026-01-01T00:00:00",
        "0000-01-01T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "not a date",
    ):
        cases.append(_post(f"created-at-{stamp}", _json(created_at=stamp)))
    for const in ("NaN", "Infinity", "-Infinity", "1e999", "-1e999"):
        cases.append(
            _post(
                f"non-finite-{const}",
                _text(lambda t, c=const: _set_raw(t, "config__gpu_memory_utilization", c)),
            )
        )
        cases.append(
            _post(
                f"non-finite-in-config-{const}",
                _text(
                    lambda t, c=const: t.replace(
                        '"compilation_config": {}', f'"compilation_config": {{"x": {c}}}'
                    )
                ),
            )
        )
    for field in ("model", "build__label", "gpu__name", "notes"):
        value = ["a\x00b"] if field == "notes" else "a\x00b"
        cases.append(_post(f"nul-in-{field}", _json(**{field: value})))
    cases.append(_post("nul-in-config-key", _json(config__compilation_config={"a\x00": "b\x00"})))
    for model in (
        "org/m#v2",
        "org/m?x",
        "org/m%41",
        "org/../m",
        "org m",
        "<script>alert(1)</script>",
        "\u202eevil",
        "x" * 300,
        "x" * 301,
        " ",
        "",
    ):
        cases.append(_post(f"model-{model[:24]!r}", _json(model=model, config__model=model)))
    for rid in ("", "a/b", "a b", "x" * 201, "../../etc", "a%00"):
        cases.append(_post(f"report-id-{rid[:12]!r}", _json(report_id=rid)))
        cases.append(_post(f"run-id-{rid[:12]!r}", _json(run_id=rid)))
    for rank, world in ((-1, 4), (4, 4), (0, 0), (0, 1 << 17), (True, 4)):
        cases.append(_post(f"rank-{rank}-of-{world}", _json(rank=rank, world_size=world)))
    for version in ("2", 1, [], {}, None):
        cases.append(_post(f"schema-version-{version!r}", _json(schema_version=version)))
    for body in ("", "null", "[]", '"x"', "1", "{}", "\ufeff{}", "{" + '"a": 1,' * 10 + "}"):
        cases.append(_post(f"body-{body[:10]!r}", lambda b=body: b))
    cases.append(
        Case(
            "text-plain", "POST", "/api/v1/reports", _json(), {**AUTH, "Content-Type": "text/plain"}
        )
    )
    cases.append(Case("no-content-type", "POST", "/api/v1/reports", _json(), dict(AUTH)))
    cases.append(
        Case(
            "wrong-token",
            "POST",
            "/api/v1/reports",
            _json(),
            {"Content-Type": "application/json", "Authorization": "Bearer x"},
        )
    )
    cases.append(
        Case(
            "token-non-ascii",
            "POST",
            "/api/v1/reports",
            _json(),
            {"Content-Type": "application/json", "Authorization": "Bearer \u00e9".encode()},
        )
    )
    cases.append(_post("over-size-limit", lambda: json.dumps(_fresh(notes=["x" * (5 << 20)]))))
    for path in ("/api/v1/estimate", "/api/v1/what-if"):
        for name, make in (
            ("deep", _text(lambda t: _set_raw(t, "config__compilation_config", _nested(300)))),
            ("nan", _text(lambda t: _set_raw(t, "config__gpu_memory_utilization", "NaN"))),
            ("brackets", lambda: "[" * 100000),
            ("bigint", _text(lambda t: _set_raw(t, "rank", "9" * 5000))),
            ("created-at", _json(created_at="0001-01-01T00:00:00+01:00")),
            ("surrogate", _json(model="a\ud800")),
            ("sum-past-int64", _stages_summing_past_int64),
        ):
            cases.append(_post(f"{path.rsplit('/', 1)[1]}-{name}", make, path))
    return cases


def _set_raw(text: str, dotted: str, raw: str) -> str:
    """Replace the JSON value of ``dotted`` by ``raw`` text (e.g. NaN, a 5,000-digit integer)."""
    data = json.loads(text)
    marker = f"__raw_{uuid.uuid4().hex}__"
    *parents, last = dotted.split("__")
    target = data
    for p in parents:
        target = target[p]
    target[last] = marker
    return json.dumps(data).replace(f'"{marker}"', raw)


def _read_cases() -> list[Case]:
    cases: list[Case] = []
    for stamp in (
        "0001-01-01T00:00:00%2B01:00",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "not-a-date",
        "2026-01-01T00:00:00%2B99:00",
    ):
        for key in ("since", "until"):
            cases.append(Case(f"runs-{key}-{stamp}", "GET", f"/api/v1/runs?{key}={stamp}"))
    hostile_ids = ("a%00b", "%00", "%ED%A0%80", "%FF", "x" * 500, "..%2F..%2Fetc", "%2523", "a%0Ab")
    for hid in hostile_ids:
        for path in (
            f"/api/v1/runs/{hid}",
            f"/api/v1/runs/{hid}/breakdown",
            f"/api/v1/runs/{hid}/ranks/0",
            f"/api/v1/reports/{hid}",
            f"/models/{hid}",
            f"/history/{hid}",
            f"/models/deepseek-ai/DeepSeek-V4-Flash-DSpark?run={hid}",
        ):
            cases.append(Case(f"get-{path}", "GET", path))
        cases.append(Case(f"delete-{hid}", "DELETE", f"/api/v1/runs/{hid}", headers=AUTH))
    for query in (
        "model=a%00b",
        "build=%00",
        "commit=%00",
        "gpu=%ED%A0%80",
        "source=%00",
        "commit=%25_",
        "limit=0",
        "limit=99999999999999999999",
        "offset=-1",
        "offset=99999999999999999999",
    ):
        cases.append(Case(f"runs-{query}", "GET", f"/api/v1/runs?{query}"))
    for query in ("a=%00&b=x", f"a={DS_MAIN}&b=%ED%A0%80", f"a={DS_MAIN}&b=" + "x" * 300):
        cases.append(Case(f"compare-{query[:30]}", "GET", f"/api/v1/compare?{query}"))
        cases.append(Case(f"compare-page-{query[:30]}", "GET", f"/compare?{query}"))
    for query in ("model=%00", "model=", "model=%ED%A0%80"):
        cases.append(Case(f"history-{query}", "GET", f"/api/v1/history?{query}"))
    for cfg in ("[" * 4000, '{"a":' * 800, "%00", '{"max_num_seqs": 1e999}', "NaN", "9" * 4000):
        cases.append(
            Case(f"plan-config-{cfg[:8]}", "GET", f"/api/v1/plan?compilation_config={quote(cfg)}")
        )
    for query in ("gpu=%00", "max_num_seqs=-1", "max_num_seqs=99999999999999999999999"):
        cases.append(Case(f"plan-{query}", "GET", f"/api/v1/plan?{query}"))
    cases.append(
        Case("breakdown-rank-huge", "GET", f"/api/v1/runs/{DS_PR}/breakdown?rank=99999999999")
    )
    cases.append(Case("login-next-nul", "GET", "/login?next=%00"))
    for form in (
        "token=%00",
        "token=%ED%A0%80",
        "token=x&next=//evil.example",
        "token=" + "x" * 10000,
        "&" * 5000,
        "token=%FF%FE",
    ):
        cases.append(
            Case(
                f"login-form-{form[:16]}",
                "POST",
                "/login",
                lambda f=form: f,
                {"Content-Type": "application/x-www-form-urlencoded"},
            )
        )
    return cases


CASES = _write_cases() + _read_cases()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def hostile_client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """One server per backend for the whole module, demo data loaded."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'memest.db'}"
        yield from _client(url)
        return
    with pg_schema("memest_hostile") as url:
        yield from _client(url)


def _client(url: str) -> Iterator[httpx.Client]:
    # A real uvicorn, not httpx.Client: httpx.Client decodes the path twice (org/m%2541 -> org/mA).
    app = create_app(Settings(database_url=url, write_token=TOKEN, demo=True))  # type: ignore[arg-type]
    with serve(app, start_timeout_s=30) as base, httpx.Client(base_url=base, timeout=60) as client:
        yield client


def _send(client: httpx.Client, case: Case) -> Any:
    body = case.body() if case.body is not None else None
    return client.request(case.method, case.path, content=body, headers=case.headers)


def _read_paths(client: httpx.Client) -> list[str]:
    """Every read of every stored run and model, and the links the dashboard home shows."""
    paths = ["/", "/docs", "/openapi.json", "/metrics", "/healthz", "/api/v1/models"]
    runs = client.get("/api/v1/runs?limit=500").json()["data"]
    paths.append("/api/v1/runs?limit=500")
    for run in runs:
        rid = quote(run["run_id"], safe="")
        paths += [f"/api/v1/runs/{rid}", f"/api/v1/runs/{rid}/breakdown"]
        paths += [f"/api/v1/runs/{rid}/ranks/{r}" for r in run["ranks"]]
        paths.append(f"/api/v1/compare?a={quote(DS_MAIN)}&b={rid}")
        paths.append(f"/compare?a={quote(DS_MAIN)}&b={rid}")
    for model in client.get("/api/v1/models").json()["data"]:
        paths.append(f"/api/v1/history?model={quote(model['model'], safe='')}")
    home = client.get("/").text
    paths += [link.replace("&amp;", "&") for link in re.findall(r'href="(/[^"]*)"', home)]
    return paths


def _assert_reads_ok(client: httpx.Client, only_new: set[str] | None = None) -> None:
    failures = []
    for path in _read_paths(client):
        if (
            only_new is not None
            and not any(n in path for n in only_new)
            and "/api/v1/runs/" in path
        ):
            continue
        r = client.get(path)
        if r.status_code != 200:
            failures.append(f"GET {path} -> {r.status_code}: {r.text[:200]}")
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request_is_never_a_5xx(hostile_client: httpx.Client, case: Case) -> None:
    response = _send(hostile_client, case)
    assert response.status_code < 500, f"{case.name}: {response.status_code} {response.text[:300]}"
    if (
        case.method == "POST"
        and response.status_code in (200, 201)
        and case.path.endswith("reports")
    ):
        run_id = response.json()["run_id"]
        _assert_reads_ok(hostile_client, only_new={quote(run_id, safe="")})


def test_every_read_still_answers_200_after_the_hostile_writes(
    hostile_client: httpx.Client,
) -> None:
    _assert_reads_ok(hostile_client)
    assert len(_read_paths(hostile_client)) > 20

"""A real Prometheus (Debian's package, installed by scripts/setup-test-extras.sh) scrapes a running
`memest serve`; every PromQL expression of the shipped Grafana dashboard, its variables resolved as
Grafana resolves them, returns at least one series through Prometheus's query API.

Two data sets: the published demo (builds labelled main and PR) and the real reports under
tests/data/reports, pushed as the plugin would and labelled by default
(vllm-<version>+memest-<version>, no build called main).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_tool

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "prometheus-test-token"
START_TIMEOUT_S = 90
SCRAPE_INTERVAL_S = 1
# Grafana's "All" for a multi-value variable matches any value; a regex that does the same.
ALL = ".*"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _wait(what: str, check: Any, proc: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what}: exited with {proc.returncode}"
        try:
            result = check()
            if result:
                return result
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{what}: not ready after {START_TIMEOUT_S} s")


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module", params=["demo", "reports"])
def prometheus(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Prometheus's base URL, once it has scraped memest (loaded with the data set) twice."""
    require_tool("prometheus", command=True)
    tmp = tmp_path_factory.mktemp(request.param)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEST_")}
    env["MEMEST_WRITE_TOKEN"] = TOKEN
    memest_port, prom_port = _free_port(), _free_port()
    memest_url = f"http://127.0.0.1:{memest_port}"
    serve = [sys.executable, "-m", "memest", "serve", "--port", str(memest_port)]
    serve += ["--database-url", f"sqlite:///{tmp / 'memest.db'}"]
    serve += ["--demo"] if request.param == "demo" else []
    memest = _start(serve, env, tmp / "memest.log")
    procs = [memest]
    try:
        _wait("memest serve", lambda: _get_json(f"{memest_url}/healthz")["status"] == "ok", memest)
        if request.param == "reports":
            push = [sys.executable, "-m", "memest", "push", str(ROOT / "tests/data/reports")]
            done = subprocess.run(
                push + ["--url", memest_url], env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stdout + done.stderr
        config = tmp / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
            "scrape_configs:\n  - job_name: memest\n"
            # The dashboard's panels read the detail families (README: /metrics).
            "    params:\n      detail: ['true']\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{memest_port}']\n"
        )
        prom = _start(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}"]
            + [f"--web.listen-address=127.0.0.1:{prom_port}"],
            env,
            tmp / "prometheus.log",
        )
        procs.append(prom)
        url = f"http://127.0.0.1:{prom_port}"
        # Two scrapes of the ingest counter: rate() needs two samples.
        _wait(
            "prometheus scrapes",
            lambda: (
                len(_query(url, "count_over_time(up{job='memest'}[1m]) >= 3")) == 1
                and _query(url, "up{job='memest'} == 1")
            ),
            prom,
        )
        yield url
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    try:
        answer = _get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    except urllib.error.HTTPError as exc:  # Prometheus's answer says what it refused
        pytest.fail(f"{expr}: {exc.code} {exc.read().decode()}")
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _label_values(base: str, query: str, variables: dict[str, str]) -> list[str]:
    """Grafana's label_values(metric{selector}, label) through Prometheus's series API."""
    found = re.fullmatch(r"label_values\((.+), (\w+)\)", _resolve(query, variables))
    assert found, query
    selector, label = found.groups()
    params = urllib.parse.urlencode({"match[]": selector})
    series = _get_json(f"{base}/api/v1/series?{params}")["data"]
    return sorted({s[label] for s in series if label in s})


def _resolve(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(f"${name}", value)
    return expr


def _dashboard() -> dict[str, Any]:
    path = resources.files("memest.service") / "grafana" / "memest-dashboard.json"
    dash: dict[str, Any] = json.loads(path.read_text())
    return dash


def _variables(base: str) -> dict[str, str]:
    """Each variable's value on a dashboard opened with its defaults: All for a multi-value one;
    for a single-value one its saved value when the query offers it, else the first offered."""
    values: dict[str, str] = {}
    for var in _dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        options = _label_values(base, var["query"], values)
        assert options, (var["name"], var["query"])
        if var.get("includeAll"):
            values[var["name"]] = ALL
        else:
            saved = var.get("current", {}).get("value")
            values[var["name"]] = saved if saved in options else options[0]
    return values


def test_every_dashboard_expression_returns_a_series(prometheus: str) -> None:
    variables = _variables(prometheus)
    results = {}
    for panel in _dashboard()["panels"]:
        for target in panel["targets"]:
            expr = _resolve(target["expr"], variables)
            assert "$" not in expr, expr
            results[panel["title"]] = _query(prometheus, expr)
    empty = [title for title, series in results.items() if not series]
    assert not empty, (empty, variables)
    print(json.dumps({t: len(s) for t, s in results.items()}))


def test_relative_panel_divides_by_the_baseline(prometheus: str) -> None:
    """The relative panel's values are each build's KV tokens over the baseline build's, read
    back from the raw series of the same Prometheus."""
    variables = _variables(prometheus)
    (panel,) = [p for p in _dashboard()["panels"] if p["title"].startswith("KV capacity relative")]
    ratios = _query(prometheus, _resolve(panel["targets"][0]["expr"], variables))

    def key(m: dict[str, str], build: str) -> tuple[str, str, str, str]:
        return (m["model"], build, m["config"], m["mode"])

    # Each set's tokens, its build, configuration and mode read from its memest_run_info line
    # (matched on model and key in Python, not by the panel's join).
    info = {
        (s["metric"]["model"], s["metric"]["key"]): s["metric"]
        for s in _query(prometheus, "memest_run_info")
    }
    tokens = {}
    for s in _query(prometheus, "memest_kv_tokens"):
        labels = info[(s["metric"]["model"], s["metric"]["key"])]
        tokens[key(labels, labels["build"])] = float(s["value"][1])
    baseline = variables["baseline"]
    builds = {k[1] for k in tokens}
    assert baseline == ("main" if "main" in builds else sorted(builds)[0])
    for series in ratios:
        m = series["metric"]
        # Divided by the baseline build's tokens of the same model, configuration and mode.
        expected = tokens[key(m, m["build"])] / tokens[key(m, baseline)]
        assert float(series["value"][1]) == pytest.approx(expected)
    assert any(s["metric"]["build"] == baseline and float(s["value"][1]) == 1.0 for s in ratios)

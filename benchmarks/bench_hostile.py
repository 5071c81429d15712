"""Hostile requests against `memest serve` (a real process on 127.0.0.1, no token for reads): how
each is answered, and /healthz's latency while it runs.

  python benchmarks/bench_hostile.py                                   # SQLite in a temp folder
  python benchmarks/bench_hostile.py --database-url postgresql+psycopg://postgres@127.0.0.1/test
  python benchmarks/bench_hostile.py --only pages --only control
                     # the page floods and their control only (--only: part of a scenario's
                     # name; repeatable)

Run it from outside the repository with PYTHONPATH naming the tree to measure (`python -m memest`
would import the current directory's memest first). Loopback only; every scenario is bounded
(--scenario-s). /healthz is probed every 10 ms over one keep-alive connection from 127.0.0.2 (a
client apart from the attacker's 127.0.0.1, as a kubelet would be).

Prints one JSON object per scenario: the hostile requests' answers (status: count), their wall
time, and /healthz latency (p50, p99, max, in ms; samples). A benchmark, not a test: timings
depend on the machine.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx

TOKEN = "bench-hostile-write-token"
#: Runs stored for the uncached compare pages: PAIR_RUNS * (PAIR_RUNS - 1) ordered pairs.
PAIR_RUNS = 8
READ_TOKEN = "bench-hostile-read-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_up(url: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("memest serve did not start")


def _probe_loop(port: int, interval_s: float, stop: Any, out: Any) -> None:
    """GET /healthz every ``interval_s`` over one keep-alive connection from 127.0.0.2 until
    ``stop`` is set; sends (latencies in ms, failures) to ``out``."""

    def connect() -> http.client.HTTPConnection:
        return http.client.HTTPConnection(
            "127.0.0.1", port, timeout=60, source_address=("127.0.0.2", 0)
        )

    samples: list[float] = []
    failures = 0
    conn = connect()
    while not stop.is_set():
        start = time.perf_counter()
        try:
            conn.request("GET", "/healthz")
            answer = conn.getresponse()
            answer.read()
            if answer.status == 200:
                samples.append((time.perf_counter() - start) * 1000)
            else:
                failures += 1
        except (OSError, http.client.HTTPException):
            failures += 1
            conn.close()
            conn = connect()
        time.sleep(interval_s)
    conn.close()
    out.send((samples, failures))


class Probe:
    """_probe_loop in a process of its own, so that the attackers' threads in this process
    never delay a probe (its latencies are the server's)."""

    def __init__(self, port: int, interval_s: float = 0.01) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._recv, send = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_probe_loop, args=(port, interval_s, self._stop, send), daemon=True
        )
        self.samples: list[float] = []
        self.failures = 0

    def __enter__(self) -> Probe:
        self._process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self.samples, self.failures = self._recv.recv()
        self._process.join()

    def summary(self) -> dict[str, Any]:
        s = sorted(self.samples)
        if not s:
            return {"samples": 0, "failures": self.failures}
        return {
            "samples": len(s),
            "failures": self.failures,
            "p50_ms": round(statistics.median(s), 2),
            "p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2),
            "max_ms": round(s[-1], 2),
        }


def _report(stages: int = 0, triggers: bool = True) -> dict[str, Any]:
    from memest.demo.h200 import h200_reports

    data: dict[str, Any] = json.loads(h200_reports()[0].model_dump_json())
    tag = uuid.uuid4().hex[:10]
    data.update(
        {"report_id": f"hostile-{tag}-r0", "run_id": f"hostile-{tag}", "source": "synthetic"}
    )
    if stages:
        bd = data["breakdown"]
        bd["stages"] = [
            {"stage": f"s{i}", "pool_growth_bytes": 4 << 20, "phase": "capture"}
            for i in range(stages)
        ]
        bd["triggers"] = [
            {"stage": f"s{i}", "owner": f"o{i}", "bytes": 1 << 20, "phase": "capture"}
            for i in range(stages if triggers else 0)
        ]
        bd["graph_pool_growth_bytes"] = stages * (4 << 20)
    return data


def _preflight(layers: int) -> dict[str, Any]:
    from memest.service.examples import PREFLIGHT_REQUEST

    body = deepcopy(PREFLIGHT_REQUEST)
    body["model_config"].update(
        num_hidden_layers=layers, hidden_size=256, intermediate_size=512, vocab_size=1000
    )
    return body


Attack = Callable[[httpx.Client], int]


def _post(path: str, body: bytes, headers: dict[str, str] | None = None) -> Attack:
    def attack(http: httpx.Client) -> int:
        h = {"Content-Type": "application/json", **(headers or {})}
        return http.post(path, content=body, headers=h).status_code

    return attack


def _get(path: str) -> Attack:
    def attack(http: httpx.Client) -> int:
        return http.get(path).status_code

    return attack


def _scenario(
    url: str, port: int, name: str, attack: Attack, count: int, parallel: int, cap_s: float
) -> dict[str, Any]:
    answers: Counter[str] = Counter()
    local = threading.local()
    with Probe(port) as probe, ThreadPoolExecutor(parallel) as pool:
        time.sleep(0.3)  # a baseline before the first hostile request
        start = time.monotonic()

        def one(_: int) -> None:
            if time.monotonic() - start > cap_s:
                answers["not sent (scenario cap)"] += 1
                return
            if not hasattr(local, "http"):  # one keep-alive client per attacking thread
                local.http = httpx.Client(base_url=url, timeout=cap_s)
            try:
                answers[str(attack(local.http))] += 1
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1
                local.http = httpx.Client(base_url=url, timeout=cap_s)

        list(pool.map(one, range(count)))
    return {
        "scenario": name,
        "requests": count,
        "parallel": parallel,
        "answers": dict(answers),
        "wall_s": round(time.monotonic() - start, 2),
        "healthz": probe.summary(),
    }


def _trickled_logins(url: str, port: int, clients: int, cap_s: float) -> dict[str, Any]:
    """``clients`` connections that send a login head and then trickle the body."""
    socks: list[socket.socket] = []
    refused = 0
    start = time.monotonic()
    with Probe(port) as probe:
        for _ in range(clients):
            try:
                s = socket.create_connection(
                    ("127.0.0.1", port), timeout=5, source_address=("127.0.0.3", 0)
                )
                s.sendall(
                    b"POST /login HTTP/1.1\r\nHost: b\r\nContent-Type: "
                    b"application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\ntoken="
                )
                socks.append(s)
            except OSError:
                refused += 1
        # A request from the attacker's address (over its connection cap), and another client's.
        own = _get_from("127.0.0.3", url + "/api/v1/models")
        other = _get_from("127.0.0.4", url + "/api/v1/models")
        while time.monotonic() - start < cap_s:
            for s in socks:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            time.sleep(1.0)
        answered = Counter[str]()
        for s in socks:
            try:
                s.settimeout(0.5)
                head = s.recv(64)
                answered[head.split(b" ", 2)[1].decode() if head else "closed"] += 1
            except (OSError, IndexError):
                answered["open"] += 1
            s.close()
    return {
        "scenario": f"{clients} trickled login bodies",
        "answers": dict(answered),
        "refused_at_connect": refused,
        "read_from_the_attackers_address": own,
        "read_from_another_client": other,
        "wall_s": round(time.monotonic() - start, 2),
        "healthz": probe.summary(),
    }


def _get_from(source: str, url: str) -> int | str:
    transport = httpx.HTTPTransport(local_address=source)
    try:
        with httpx.Client(transport=transport, timeout=30) as http:
            return http.get(url).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", default=None, help="default: SQLite in a temp folder")
    p.add_argument("--scenario-s", type=float, default=60.0, help="cap per scenario, seconds")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="run only the scenarios whose name contains TEXT (repeatable; 'idle' always runs)",
    )
    args = p.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        db = args.database_url or f"sqlite:///{Path(tmp) / 'm.db'}"
        cmd = [sys.executable, "-m", "memest", "serve", "--port", str(port), "--database-url", db]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MEMEST_WRITE_TOKEN": TOKEN}
        log = (Path(tmp) / "serve.log").open("w")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_up(url, 60)
            for result in _run_all(url, port, args.scenario_s, args.only):
                print(json.dumps(result), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    return 0


def _run_all(url: str, port: int, cap_s: float, only: list[str]) -> list[dict[str, Any]]:
    from memest.service import limits

    auth = {"Authorization": f"Bearer {TOKEN}"}
    stored = {}
    with httpx.Client(base_url=url, timeout=120) as http:
        for stages in (1000, 2000):
            data = _report(stages)
            answer = http.post("/api/v1/reports", json=data, headers=auth)
            assert answer.status_code == 201, answer.text
            stored[stages] = data["run_id"]
            model = data["model"]
        # Runs of another model (the history scenario's stays at two) whose ordered pairs make
        # 45 compare pages none of which is cached.
        others = []
        for i in range(PAIR_RUNS):
            data = _report(1000 if i % 2 else 2000)
            data["model"] += "-pairs"
            answer = http.post("/api/v1/reports", json=data, headers=auth)
            assert answer.status_code == 201, answer.text
            others.append(data["run_id"])
    pairs = itertools.cycle([(a, b) for a in others for b in others if a != b])
    w30k = _report(30_000, triggers=False)
    w_limit = _report(limits.MAX_STAGES)
    dump = lambda d: json.dumps(d).encode()  # noqa: E731

    def chosen(name: str) -> bool:
        return name == "idle" or not only or any(part in name for part in only)

    def scenario(name: str, *rest: Any) -> dict[str, Any] | None:
        return _scenario(url, port, name, *rest) if chosen(name) else None

    def trickled(clients: int, cap: float) -> dict[str, Any] | None:
        name = f"{clients} trickled login bodies"
        return _trickled_logins(url, port, clients, cap) if chosen(name) else None

    results = [
        scenario("idle", lambda h: h.get("/healthz").status_code, 1, 1, cap_s),
        scenario(
            "preflight 3,000 layers",
            _post("/api/v1/preflight", dump(_preflight(3000))),
            1,
            1,
            cap_s,
        ),
        scenario(
            "preflight 10^5 layers",
            _post("/api/v1/preflight", dump(_preflight(10**5))),
            1,
            1,
            cap_s,
        ),
        scenario(
            "preflight 10^7 layers",
            _post("/api/v1/preflight", dump(_preflight(10**7))),
            1,
            1,
            cap_s,
        ),
        scenario(
            f"preflight {limits.MAX_LAYERS} layers (the limit) x 16",
            _post("/api/v1/preflight", dump(_preflight(limits.MAX_LAYERS))),
            16,
            16,
            cap_s,
        ),
        scenario(
            "what-if 30k stages",
            _post("/api/v1/what-if", dump({"report": w30k, "plan": w30k["capture_plans"][0]})),
            1,
            1,
            cap_s,
        ),
        scenario(
            f"what-if {limits.MAX_STAGES} stages (the limit) x 8",
            _post(
                "/api/v1/what-if", dump({"report": w_limit, "plan": w_limit["capture_plans"][0]})
            ),
            8,
            8,
            cap_s,
        ),
        scenario(
            "45 estimates of a stored 2k x 2k run",
            _post(f"/api/v1/runs/{stored[2000]}/estimate", b"{}"),
            45,
            45,
            cap_s,
        ),
        scenario(
            "45 estimates of a stored 1k x 1k run",
            _post(f"/api/v1/runs/{stored[1000]}/estimate", b"{}"),
            45,
            45,
            cap_s,
        ),
        scenario(
            "2,000 bearer-token guesses",
            _post("/api/v1/reports", b"{}", {"Authorization": "Bearer guess-0000000000000"}),
            2000,
            16,
            cap_s,
        ),
        scenario("100 login guesses, rotated X-Forwarded-For", _login_guess, 100, 4, cap_s),
        trickled(1000, min(cap_s, 15.0)),
        scenario(
            "16 plans of max_cudagraph_capture_size 2^20",
            _get(
                "/api/v1/plan?"
                + urlencode({"compilation_config": '{"max_cudagraph_capture_size": 1048576}'})
            ),
            16,
            16,
            cap_s,
        ),
        scenario(
            "45 static files at once (control: the floods' own load, no computation)",
            _get("/static/memest.css"),
            45,
            45,
            cap_s,
        ),
        scenario(
            "45 model pages of a 2k x 2k run",
            _get(f"/models/{quote(model, safe='')}?run={stored[2000]}"),
            45,
            45,
            cap_s,
        ),
        scenario(
            "45 compare pages, 1k x 1k vs 2k x 2k",
            _get(f"/compare?a={stored[1000]}&b={stored[2000]}"),
            45,
            45,
            cap_s,
        ),
        scenario(
            "45 compare pages of 45 pairs of 1k-2k runs (uncached)",
            lambda h: (
                h.get("/compare", params=dict(zip("ab", next(pairs), strict=True))).status_code
            ),
            45,
            45,
            cap_s,
        ),
        scenario("45 history pages", _get(f"/history/{quote(model, safe='')}"), 45, 45, cap_s),
    ]
    return [r for r in results if r is not None]


def _login_guess(http: httpx.Client) -> int:
    forwarded = f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.1"
    return http.post(
        "/login", data={"token": "guess-0000000000000"}, headers={"X-Forwarded-For": forwarded}
    ).status_code


if __name__ == "__main__":
    sys.exit(main())

"""Reads racing a DELETE of the run they read, and DELETEs racing each other, against
`memest serve` (a real process on 127.0.0.1): every answer counted by route and status.

  python benchmarks/bench_delete_race.py --database-url postgresql+psycopg://postgres@127.0.0.1/test
  python benchmarks/bench_delete_race.py                # SQLite in a temp folder

Run it from outside the repository with PYTHONPATH naming the tree to measure (as
bench_hostile.py, whose server and report helpers it uses). Each round stores two runs of one
model, then releases 16 reads (the run's API routes, its estimate, its model, compare and history
pages, /metrics, the home page) and 8 DELETEs of the first run at one barrier, with 3 more reads
of each route behind them. A read may answer the run (200) or 404; a DELETE 200 once and 404 for
the others; a 5xx, or a traceback in the server's log, is a failure. Prints one JSON object:
statuses overall, per route, and the rounds whose DELETEs did not answer one 200 and seven 404.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from bench_hostile import TOKEN, _free_port, _report, _wait_up

AUTH = {"Authorization": f"Bearer {TOKEN}"}
READERS = 16
DELETERS = 8


def _race(url: str, rounds: int) -> dict[str, Any]:
    reads: Counter[str] = Counter()
    deletes: Counter[int] = Counter()
    odd_rounds: list[list[int]] = []
    local = threading.local()

    def client() -> httpx.Client:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=url, timeout=60)
        http: httpx.Client = local.http
        return http

    with httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(rounds):
            a, b = _report(4), _report(4)
            b["model"] = a["model"]
            for data in (a, b):
                answer = http.post("/api/v1/reports", json=data, headers=AUTH)
                assert answer.status_code == 201, answer.text
            run, other, model = a["run_id"], b["run_id"], quote(a["model"], safe="")
            routes = [
                ("GET", f"/api/v1/runs/{run}"),
                ("GET", f"/api/v1/runs/{run}/breakdown"),
                ("GET", f"/api/v1/runs/{run}/ranks/0"),
                ("GET", f"/api/v1/reports/{a['report_id']}"),
                ("GET", f"/api/v1/compare?a={run}&b={other}"),
                ("POST", f"/api/v1/runs/{run}/estimate"),
                ("GET", "/api/v1/runs"),
                ("GET", "/api/v1/models"),
                ("GET", f"/models/{model}?run={run}"),
                ("GET", f"/compare?a={run}&b={other}"),
                ("GET", f"/history/{model}"),
                ("GET", "/metrics"),
                ("GET", "/"),
            ]
            start = threading.Barrier(READERS + DELETERS)

            def read(
                i: int,
                routes: list[tuple[str, str]] = routes,
                run: str = run,
                start: threading.Barrier = start,
            ) -> str:
                method, path = routes[i % len(routes)]
                if i < READERS:
                    start.wait()
                answer = client().request(method, path, json={} if method == "POST" else None)
                return f"{method} {path.split('?')[0].replace(run, '{run}')} {answer.status_code}"

            def delete(_: int, run: str = run, start: threading.Barrier = start) -> int:
                start.wait()
                return client().delete(f"/api/v1/runs/{run}", headers=AUTH).status_code

            with ThreadPoolExecutor(READERS + DELETERS) as pool:
                read_jobs = [pool.submit(read, i) for i in range(READERS + 3 * len(routes))]
                delete_jobs = [pool.submit(delete, i) for i in range(DELETERS)]
                reads.update(job.result() for job in read_jobs)
                codes = sorted(job.result() for job in delete_jobs)
            deletes.update(codes)
            if codes != [200] + [404] * (DELETERS - 1):
                odd_rounds.append(codes)
            assert http.get(f"/api/v1/runs/{run}").status_code == 404
            http.delete(f"/api/v1/runs/{other}", headers=AUTH)
    statuses = Counter(key.rsplit(" ", 1)[1] for key in reads.elements())
    return {
        "rounds": rounds,
        "read_statuses": dict(statuses),
        "delete_statuses": {str(k): v for k, v in deletes.items()},
        "rounds_not_one_200_and_seven_404": odd_rounds,
        "reads": dict(sorted(reads.items())),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", default=None, help="default: SQLite in a temp folder")
    p.add_argument("--rounds", type=int, default=20, help="runs stored and deleted (default 20)")
    args = p.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        db = args.database_url or f"sqlite:///{Path(tmp) / 'm.db'}"
        cmd = [sys.executable, "-m", "memest", "serve", "--port", str(port), "--database-url", db]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MEMEST_WRITE_TOKEN": TOKEN}
        log_path = Path(tmp) / "serve.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                _wait_up(url, 60)
                result = _race(url, args.rounds)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        lines = log_path.read_text().splitlines()
        result["server_log_tracebacks"] = sum("Traceback" in line for line in lines)
    print(json.dumps(result), flush=True)
    failed = any(s.startswith("5") for s in result["read_statuses"]) or any(
        k.startswith("5") for k in result["delete_statuses"]
    )
    return 1 if failed or result["rounds_not_one_200_and_seven_404"] else 0


if __name__ == "__main__":
    sys.exit(main())

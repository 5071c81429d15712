"""Latency of the dashboard's history page for a model with thousands of runs (real uvicorn on
127.0.0.1, SQLite file).

Stores RUNS copies of a real H200 start of one model (memest/demo/h200: new run and report ids,
one a minute, in four configurations), then GETs /history/<model> (the newest page) and older
pages in turn, sequentially, and prints the first (cold) request's time and p50/p99 of the
rest, then what one new run costs the next request.

  python benchmarks/bench_pages.py                 # 3,000 runs, 300 requests
  python benchmarks/bench_pages.py --runs 500 --requests 100

Exits 1 when p99 is above the target (200 ms). A benchmark, not a test: numbers depend on the
machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx

from memest.demo.h200 import h200_reports
from memest.schema import RunReport
from memest.service import db, store
from memest.service.metrics_cache import metric_rows_json

TARGET_P99_S = 0.200
SEQS = (128, 64, 32, 256)  # four configurations of the one model


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def _source() -> RunReport:
    """The demo's dense Llama 8B start memest sized (apply)."""
    return next(r for r in h200_reports() if r.run_id.startswith("S_llama8b_s128_t4096.apply"))


def _copy(base: RunReport, i: int) -> RunReport:
    config = base.config.model_copy(update={"max_num_seqs": SEQS[i % len(SEQS)]})
    return base.model_copy(
        update={
            "run_id": f"bench-{i:05d}",
            "report_id": uuid.uuid4().hex,
            "created_at": base.created_at + timedelta(minutes=i),
            "config": config,
            "config_fingerprint": None,
        }
    )


def fill(url: str, runs: int) -> str:
    """Store ``runs`` copies of one start; returns the model's name."""
    engine = db.make_engine(url)
    db.upgrade(engine)
    factory = db.make_sessionmaker(engine)
    base = _source()
    for i in range(runs):
        report = _copy(base, i)
        store.ingest(factory, report, metric_rows_json(report))
    engine.dispose()
    return base.model


def serve(url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "MEMEST_DATABASE_URL": url, "MEMEST_WRITE_TOKEN": "bench-token-0123"}
    cmd = [sys.executable, "-m", "memest", "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("the server did not start")


def timed(client: httpx.Client, path: str) -> float:
    start = time.perf_counter()
    r = client.get(path)
    took = time.perf_counter() - start
    if r.status_code != 200:
        raise RuntimeError(f"GET {path}: HTTP {r.status_code}")
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        start = time.perf_counter()
        model = fill(url, args.runs)
        print(f"stored {args.runs:,} runs of {model} in {time.perf_counter() - start:.1f} s")
        proc, base = serve(url)
        try:
            with httpx.Client(base_url=base, timeout=120) as client:
                path = f"/history/{model}"
                pages = -(-args.runs // 100)
                cold = timed(client, path)
                print(f"first request (every report parsed): {cold * 1000:.0f} ms")
                times = [
                    timed(client, f"{path}?page={1 + i % pages}") for i in range(args.requests)
                ]
                again = _after_a_new_run(client, base, path, model)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    p50 = statistics.median(times)
    p99 = statistics.quantiles(times, n=100)[98]
    print(
        f"history of {args.runs:,} runs, {len(times)} requests over {pages} pages: "
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms (target <= {TARGET_P99_S * 1000:.0f})"
    )
    print(f"after one new run, the next request: {again * 1000:.0f} ms")
    return 0 if p99 <= TARGET_P99_S else 1


def _after_a_new_run(client: httpx.Client, base: str, path: str, model: str) -> float:
    """POST one more run of the model, then time the page: only that report is parsed."""
    report = _copy(_source(), 10**5 - 1)
    r = client.post(
        "/api/v1/reports",
        content=report.model_dump_json(),
        headers={"Authorization": "Bearer bench-token-0123", "Content-Type": "application/json"},
    )
    if r.status_code not in (200, 201):
        raise RuntimeError(f"POST: HTTP {r.status_code} {r.text}")
    return timed(client, path)


if __name__ == "__main__":
    sys.exit(main())

"""Fleet benchmark of the memest service: many models, 16 concurrent writers, then /metrics.

Ingests MODELS x RUNS small synthetic reports (built from a real one under tests/data/reports:
its breakdown kept, each with its own model name and run id) through a real uvicorn, with
WRITERS concurrent writers, while one reader samples a model page and the run API; then scrapes
/metrics twice (the rebuild after the last ingest, then the cached exposition).

  python benchmarks/bench_fleet.py                               # SQLite, 10,000 models x 3 runs
  python benchmarks/bench_fleet.py --database postgres           # PostgreSQL at 127.0.0.1:5432
  python benchmarks/bench_fleet.py --models 1000                 # scaled down

Prints ingest rate, /metrics time and size, page and API p50/p99 under the writers. A benchmark,
not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service import PG_BASE, TOKEN, start_server  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "tests/data/reports"
REAL = SOURCE / "call6.B_llama8b_s32_t2048.apply.report.rank0.json"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def _template() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REAL.read_text())
    data["source"] = "synthetic"
    return data


def _body(template: dict[str, Any], model: int, run: int) -> bytes:
    data = dict(template)
    data.update(
        model=f"fleet/model-{model:05d}",
        run_id=f"fleet-{model:05d}-{run}",
        report_id=f"fleet-{model:05d}-{run}-r0",
        created_at=f"2026-01-{1 + run:02d}T00:00:00Z",
    )
    return json.dumps(data).encode()


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def _writers(base: str, args: argparse.Namespace, done: asyncio.Event) -> float:
    template = _template()
    # (0, 0) is posted before the writers start.
    jobs = [(m, r) for r in range(args.runs) for m in range(args.models) if (m, r) != (0, 0)]
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    failures: list[str] = []

    async def writer() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            while not queue.empty():
                m, r = queue.get_nowait()
                answer = await client.post(
                    "/api/v1/reports", content=_body(template, m, r), headers=HEADERS
                )
                if answer.status_code != 201:
                    failures.append(f"{answer.status_code} {answer.text[:100]}")

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(args.writers)))
    elapsed = time.perf_counter() - start
    done.set()
    if failures:
        print(f"{len(failures)} writes failed, first: {failures[0]}")
    print(f"ingest: {len(jobs)} reports in {elapsed:.1f} s = {len(jobs) / elapsed:.1f} reports/s")
    return elapsed


async def _reader(base: str, done: asyncio.Event) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"page": [], "api": []}
    model = quote("fleet/model-00000", safe="")
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        while not done.is_set():
            for kind, path in (("page", f"/models/{model}"), ("api", "/api/v1/runs?limit=50")):
                start = time.perf_counter()
                answer = await client.get(path)
                if answer.status_code == 200:
                    times[kind].append(time.perf_counter() - start)
            await asyncio.sleep(0.05)
    return times


async def _run(base: str, args: argparse.Namespace) -> None:
    done = asyncio.Event()
    # The first model's runs go in first, so the reader's page exists early.
    template = _template()
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        await client.post("/api/v1/reports", content=_body(template, 0, 0), headers=HEADERS)
    _, times = await asyncio.gather(_writers(base, args, done), _reader(base, done))
    for kind, values in times.items():
        if values:
            print(
                f"{kind} under {args.writers} writers: p50 {_pct(values, 50) * 1000:.0f} ms, "
                f"p99 {_pct(values, 99) * 1000:.0f} ms ({len(values)} requests)"
            )
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        for label in ("rebuilt", "cached"):
            start = time.perf_counter()
            answer = await client.get("/metrics")
            elapsed = time.perf_counter() - start
            series = sum(1 for ln in answer.text.splitlines() if ln and not ln.startswith("#"))
            print(
                f"/metrics ({label}): {elapsed:.3f} s, {len(answer.content) / 1e6:.2f} MB, "
                f"{series} series"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--models", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--writers", type=int, default=16)
    args = ap.parse_args()
    schema = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.database == "sqlite":
            url = f"sqlite:///{tmp}/fleet.db"
        else:
            import psycopg

            schema = f"memest_fleet_{uuid.uuid4().hex[:10]}"
            admin = PG_BASE.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(f'CREATE SCHEMA "{schema}"')
            url = f"{PG_BASE}?options=-csearch_path%3D{schema}"
        proc, base = start_server(url, workers=1)
        try:
            print(
                f"{args.database}: {args.models} models x {args.runs} runs, {args.writers} writers"
            )
            asyncio.run(_run(base, args))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if schema is not None:
                with psycopg.connect(admin, autocommit=True) as c:
                    c.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()

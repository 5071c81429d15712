"""Fleet benchmark of the memest service: many models, 16 concurrent writers, then /metrics.

Ingests MODELS x RUNS small synthetic reports (built from a real one under tests/data/reports:
its breakdown kept, each with its own model name and run id) through a real uvicorn, with
WRITERS concurrent writers, while one reader samples a model page and the run API and a scraper
reads /metrics every --scrape-every seconds (gzip accepted, as Prometheus asks); then scrapes
after one more ingest, unchanged, and once more after a restart of the server (everything built
afresh).

  python benchmarks/bench_fleet.py                               # SQLite, 10,000 models x 3 runs
  python benchmarks/bench_fleet.py --database postgres           # PostgreSQL at 127.0.0.1:5432
  python benchmarks/bench_fleet.py --models 1000                 # scaled down

Prints ingest rate, /metrics time and size (text and gzipped), page and API p50/p99 under the
writers, and the machine's load average at the start and at the end of ingest. A benchmark,
not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
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


def _load() -> str:
    """The machine's 1-, 5- and 15-minute load averages (a shared machine's other work)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _pct(values: list[float], q: int) -> float:
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
    print(f"load average at the end of ingest: {_load()}")
    if failures:
        print(f"{len(failures)} writes failed, first: {failures[0]}")
    print(f"ingest: {len(jobs)} reports in {elapsed:.1f} s = {len(jobs) / elapsed:.1f} reports/s")
    return elapsed


async def _scrape(client: httpx.AsyncClient, label: str) -> float:
    """One scrape as Prometheus makes it (gzip accepted); prints its time and sizes."""
    start = time.perf_counter()
    async with client.stream("GET", "/metrics", headers={"Accept-Encoding": "gzip"}) as answer:
        wire = b"".join([chunk async for chunk in answer.aiter_raw()])
    elapsed = time.perf_counter() - start
    text = gzip.decompress(wire) if answer.headers.get("content-encoding") == "gzip" else wire
    series = sum(1 for ln in text.splitlines() if ln and not ln.startswith(b"#"))
    if label:
        print(
            f"/metrics ({label}): {elapsed:.3f} s, {len(text) / 1e6:.2f} MB of text "
            f"({len(wire) / 1e6:.2f} MB gzipped), {series} series"
        )
    return elapsed


async def _scraper(base: str, done: asyncio.Event, interval: float) -> list[float]:
    """Scrapes every ``interval`` seconds while the writers run, as Prometheus would."""
    times: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        while not done.is_set():
            times.append(await _scrape(client, ""))
            try:
                await asyncio.wait_for(done.wait(), interval)
            except TimeoutError:
                pass
    return times


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
    _, times, scrapes = await asyncio.gather(
        _writers(base, args, done), _reader(base, done), _scraper(base, done, args.scrape_every)
    )
    for kind, values in times.items():
        if values:
            print(
                f"{kind} under {args.writers} writers: p50 {_pct(values, 50) * 1000:.0f} ms, "
                f"p99 {_pct(values, 99) * 1000:.0f} ms ({len(values)} requests)"
            )
    print(
        f"/metrics every {args.scrape_every:.0f} s under the writers: p50 "
        f"{_pct(scrapes, 50):.3f} s, max {max(scrapes):.3f} s ({len(scrapes)} scrapes)"
    )
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        await client.post("/api/v1/reports", content=_body(template, 0, args.runs), headers=HEADERS)
        await _scrape(client, "after one more ingest")
        await _scrape(client, "unchanged")


async def _cold(base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        await _scrape(client, "first scrape after a restart")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--models", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument(
        "--scrape-every", type=float, default=15.0, help="seconds between scrapes while ingesting"
    )
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
                f" (load average {_load()})"
            )
            asyncio.run(_run(base, args))
            proc.terminate()
            proc.wait(timeout=30)
            proc, base = start_server(url, workers=1)
            asyncio.run(_cold(base))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if schema is not None:
                with psycopg.connect(admin, autocommit=True) as c:
                    c.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()

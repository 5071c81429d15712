"""The /metrics exposition of a fleet, in process: wall and CPU time of its builds.

Fills a SQLite database with MODELS x 3 runs directly (the rows ingest writes: each run's lead
report with its stored samples, from the real report bench_fleet.py uses, under its own model
name), then times memest.service.metrics_cache.MetricsCache: the first build (a server just
started), a scrape with nothing changed, and a scrape after one more ingest (the case every
Prometheus scrape meets while reports arrive), each with its gzip; then the detail=true text. CPU time is printed beside wall time because a
shared machine's wall time says more about its other load than about this code.

  python benchmarks/bench_metrics_build.py                  # 10,000 models
  python benchmarks/bench_metrics_build.py --models 1000
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fleet import _body, _template  # noqa: E402

from memest.service import db, store  # noqa: E402
from memest.service.ingest import parse_report  # noqa: E402
from memest.service.metrics_cache import MetricsCache, metric_rows_json  # noqa: E402
from memest.service.models import Report, Run  # noqa: E402

RUNS = 3


def _fill(factory: Any, engine: Any, models: int) -> None:
    template = _template()
    first = parse_report(_body(template, 0, 0))
    samples = metric_rows_json(first)
    assert samples is not None
    payload = store.canonical_json(first)
    now = datetime.now(UTC)
    runs, reports = [], []
    for m in range(models):
        name = f"fleet/model-{m:05d}"
        for r in range(RUNS):
            run_id = f"fleet-{m:05d}-{r}"
            runs.append(
                {
                    "run_id": run_id,
                    "model": name,
                    "build_label": first.build.label,
                    "vllm_commit": first.build.vllm_commit,
                    "vllm_version": first.build.vllm_version,
                    "gpu_name": None,
                    "source": "synthetic",
                    "world_size": 1,
                    "config_fingerprint": store.run_fingerprint(first),
                    "created_at": datetime(2026, 1, 1 + r, tzinfo=UTC),
                    "ingested_at": now,
                }
            )
            reports.append(
                {
                    "report_id": f"{run_id}-r0",
                    "run_id": run_id,
                    "rank": 0,
                    "schema_version": first.schema_version,
                    "payload": payload,  # the samples below are what a scrape reads
                    "payload_sha256": hashlib.sha256(run_id.encode()).hexdigest(),
                    "size_bytes": len(payload),
                    "graph_pool_bytes": None,
                    "kv_tokens": None,
                    "metric_rows": samples.replace(first.model, name),
                    "ingested_at": now,
                }
            )
    with engine.begin() as connection:
        connection.execute(insert(Run), runs)
        connection.execute(insert(Report), reports)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = db.make_engine(f"sqlite:///{tmp}/fleet.db")
        db.upgrade(engine)
        factory = db.make_sessionmaker(engine)
        _fill(factory, engine, args.models)
        cache = MetricsCache(factory, lambda row: parse_report(row.payload.encode()))

        def timed(label: str, detail: bool = False) -> None:
            wall, cpu = time.perf_counter(), time.process_time()
            text = cache.exposition(detail)
            packed = cache.gzipped(b"", detail)  # as Prometheus asks
            print(
                f"{label}: {time.perf_counter() - wall:.3f} s wall, "
                f"{time.process_time() - cpu:.3f} s CPU, {len(text) / 1e6:.2f} MB "
                f"({len(packed) / 1e6:.2f} MB gzipped)"
            )

        print(f"{args.models} models x {RUNS} runs (SQLite)")
        timed("first build")
        timed("unchanged")
        extra = parse_report(_body(_template(), 0, RUNS))
        store.ingest(factory, extra, metric_rows_json(extra))
        timed("after one more ingest")
        timed("with detail=true", detail=True)
        engine.dispose()


if __name__ == "__main__":
    main()

"""GET /healthz and GET /metrics."""

from __future__ import annotations

import gzip
import json
import os
import threading
from pathlib import Path

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from memest.service.deps import MetricsDep, ReadAuth, SessionDep
from memest.service.metrics_cache import MetricsCache

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    responses={
        200: {"content": {"application/json": {"example": {"status": "ok"}}}},
        503: {
            "description": "The SQLite database's folder cannot be written (a full disk)",
            "content": {
                "application/json": {
                    "example": {"status": "not ok", "detail": "database folder: No space left"}
                }
            },
        },
    },
)
def healthz(session: SessionDep) -> Response:
    """Liveness, database reachability and, for SQLite, that its folder takes a write (always
    open, no token)."""
    session.execute(text("SELECT 1"))
    url = session.get_bind().engine.url
    folder = _sqlite_folder(url.get_backend_name(), url.database)
    if folder is not None:
        problem = _write_problem(folder)
        if problem is not None:
            body = json.dumps({"status": "not ok", "detail": f"database folder: {problem}"})
            return Response(body, status_code=503, media_type="application/json")
    return Response(json.dumps({"status": "ok"}), media_type="application/json")


def _sqlite_folder(backend: str, database: str | None) -> Path | None:
    """The folder of a SQLite database file; None for another database or an in-memory one."""
    if backend != "sqlite" or not database or database == ":memory:":
        return None
    return Path(database).resolve().parent


def _write_problem(folder: Path) -> str | None:
    """Why a small file cannot be written, synced and removed in ``folder`` (None when it can).
    A file beside the database, not a database write: a writer holding SQLite's lock must not
    make the health check wait (or fail)."""
    probe = folder / f".memest-healthz-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    finally:
        probe.unlink(missing_ok=True)
    return None


@router.get(
    "/metrics",
    dependencies=[ReadAuth],
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition",
            "content": {
                "text/plain": {
                    "example": 'memest_graph_pool_bytes{model="nvidia/MiniMax-M3-NVFP4",'
                    'build="PR",stage="target.full",owner="moe_workspace"} 6.039797760e+08\n'
                }
            },
        }
    },
)
def metrics(service_metrics: MetricsDep, request: Request) -> Response:
    """Prometheus metrics: memest_graph_pool_bytes{model,build,stage,owner},
    memest_graph_pool_total_bytes, memest_kv_tokens, memest_kv_cache_bytes, memest_non_kv_bytes,
    memest_estimator_error_bytes{estimator} (newest run per model and build, from its accounting) and memest_ingest_reports_total{outcome}."""
    cache: MetricsCache = request.app.state.metrics_cache
    text = generate_latest(service_metrics.registry) + cache.exposition()
    if not _accepts_gzip(request.headers.get("accept-encoding", "")):
        return Response(text, media_type=CONTENT_TYPE_LATEST)
    # Prometheus asks for gzip: a fleet's 12 MB of text is about 0.3 MB compressed, for about
    # 40 ms of compression per scrape.
    return Response(
        gzip.compress(text, mtime=0),
        media_type=CONTENT_TYPE_LATEST,
        headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
    )


def _accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (named, or "*", without q=0)."""
    for part in header.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() in ("gzip", "*"):
            q = params.strip().removeprefix("q=").strip() if "q=" in params else "1"
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False

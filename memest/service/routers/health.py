"""GET /healthz (liveness), GET /readyz (readiness: the database) and GET /metrics."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from memest.service.deps import FactoryDep, MetricsDep, ReadAuth
from memest.service.metrics_cache import MetricsCache
from memest.service.middleware import HEALTHZ_BODY

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}},
)
async def healthz() -> Response:
    """Liveness: the server's event loop answers (always open, no token). It never touches the
    database, so a database outage fails readiness (/readyz), not liveness: a restart would not
    bring the database back. memest.service.middleware.LivenessMiddleware answers it ahead of
    every other layer; this route documents it (and answers an app built without that layer)."""
    return Response(_OK, media_type="application/json")


_OK = HEALTHZ_BODY  # the one answer, also LivenessMiddleware's


@router.get(
    "/readyz",
    responses={
        200: {"content": {"application/json": {"example": {"status": "ok"}}}},
        503: {
            "description": "The database cannot be reached, or the SQLite database's folder "
            "cannot be written (a full disk)",
            "content": {
                "application/json": {
                    "example": {"status": "not ok", "detail": "database folder: No space left"}
                }
            },
        },
    },
)
def readyz(factory: FactoryDep) -> Response:
    """Readiness: the database answers a query and, for SQLite, its folder takes a write (always
    open, no token); 503 while it does not, so that traffic goes to another replica."""
    problem = _database_problem(factory)
    if problem is not None:
        body = json.dumps({"status": "not ok", "detail": problem})
        return Response(body, status_code=503, media_type="application/json")
    return Response(_OK, media_type="application/json")


def _database_problem(factory: sessionmaker[Session]) -> str | None:
    try:
        with factory() as session:
            session.execute(text("SELECT 1"))
            url = session.get_bind().engine.url
    except SQLAlchemyError as exc:
        return f"database: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    folder = _sqlite_folder(url.get_backend_name(), url.database)
    if folder is not None:
        problem = _write_problem(folder)
        if problem is not None:
            return f"database folder: {problem}"
    return None


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
                    "example": 'memest_run_info{build="PR",config="0f3c9a1d2b4e6f70",'
                    'key="5d41402a",mode="measure",model="nvidia/MiniMax-M3-NVFP4",'
                    'sized_by="vllm"} 1\n'
                    'memest_kv_tokens{key="5d41402a",model="nvidia/MiniMax-M3-NVFP4"} 3575296\n'
                }
            },
        }
    },
)
def metrics(
    service_metrics: MetricsDep,
    request: Request,
    detail: Annotated[
        bool,
        Query(
            description="Also the per-estimator, per-stage-and-owner, graph-pool total and non-KV "
            "families and memest_owner_info (about 3x the text per series set)"
        ),
    ] = False,
) -> Response:
    """Prometheus metrics. Per series set (model, build, configuration, mode, who sized the KV
    cache; the newest run of each): memest_run_info{model, key, build, config, mode, sized_by} 1
    and memest_kv_tokens, memest_kv_cache_bytes, memest_budget_bytes, memest_usage_bytes labelled
    {model, key}; with detail=true also memest_estimator_error_bytes{estimator},
    memest_graph_pool_total_bytes, memest_non_kv_bytes, memest_graph_pool_bytes{stage, owner_id}
    and memest_owner_info{owner_id, owner}. Always memest_ingest_reports_total{outcome}."""
    cache: MetricsCache = request.app.state.metrics_cache
    counters = generate_latest(service_metrics.registry)
    if not _accepts_gzip(request.headers.get("accept-encoding", "")):
        return Response(cache.exposition(detail) + counters, media_type=CONTENT_TYPE_LATEST)
    # Prometheus asks for gzip: the stored series are compressed once per change, only the
    # counters on each scrape.
    return Response(
        cache.gzipped(counters, detail),
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

"""create_app(settings): the FastAPI app, its database, routers, dashboard and metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources

import anyio
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from memest._version import __version__
from memest.service import db, store
from memest.service.compute import ComputePool
from memest.service.config import Settings, get_settings
from memest.service.deps import ReadAuth
from memest.service.errors import Conflict, install_handlers
from memest.service.ingest import IngestPool
from memest.service.metrics import ServiceMetrics
from memest.service.metrics_cache import MetricsCache, metric_rows_json
from memest.service.middleware import HardeningMiddleware, LivenessMiddleware
from memest.service.ratelimit import FailureLimiter
from memest.service.routers import (
    calculators,
    compare,
    dashboard,
    health,
    login,
    models,
    preflight,
    preflight_page,
    reports,
    runs,
)
from memest.service.sessions import SessionStore
from memest.service.templating import compile_templates

log = logging.getLogger("memest.service")

#: Reports parsed and stored at once; more writers wait their turn without holding a thread.
INGEST_THREADS = 2

DESCRIPTION = """\
Stores memest RunReports (one per rank of a vLLM start) and serves per-model breakdowns next to
the capture plan that produced them, build comparisons (the seed's "main → PR" columns), model
histories, the capture-plan and estimate calculators, and Prometheus metrics.

Pushing a report needs `Authorization: Bearer $MEMEST_PUSH_TOKEN` (push-only, for vLLM pods) or the
admin `$MEMEST_WRITE_TOKEN`, which alone may delete; reads are open unless `MEMEST_READ_TOKEN` is set
(then the read or admin token as a bearer token, or the cookie of a `/login` session, which
`/logout` ends). The calculators, and the model, compare and history pages, run in worker
processes with a deadline (503/504 past it).
Bytes are integers everywhere.
"""


def _unique_id(route: APIRoute) -> str:
    tag = route.tags[0] if route.tags else "default"
    return f"{tag}-{route.name}"


def load_demo(app: FastAPI) -> int:
    """Ingest the demo (idempotent): the seed's published figures and real H200 starts; returns
    how many reports were new."""
    from memest.demo import demo_reports
    from memest.demo.h200 import h200_reports

    created = 0
    for report in [*demo_reports(), *h200_reports()]:
        try:
            stored = store.ingest(app.state.sessionmaker, report, metric_rows_json(report))
            if stored.status == "created":
                created += 1
        except Conflict as exc:
            # A database filled by another memest version: keep what is stored, say so once.
            log.warning("demo report %s not loaded: %s", report.report_id, exc.message)
    return created


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the engine is created here, migrations run at startup.

    Args:
        settings: configuration; default from MEMEST_* environment variables.
    """
    # Validate again: a model_copy(update=...) (memest serve's generated token) skips validation
    # and would leave a plain str where the auth checks expect a SecretStr.
    settings = Settings.model_validate((settings or get_settings()).model_dump())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ingest_limiter = anyio.CapacityLimiter(INGEST_THREADS)
        # Threads reading stored reports for estimates: every runnable thread that wants the
        # GIL delays the event loop by up to a switch interval, so concurrent estimates queue
        # here (they wait for a calculator worker anyway).
        app.state.estimate_reads = anyio.CapacityLimiter(INGEST_THREADS)
        app.state.ingest_pool = IngestPool(settings.ingest_processes)
        db.upgrade(app.state.engine)
        compile_templates()
        if settings.demo:
            n = load_demo(app)
            log.info("demo: %d published reports loaded", n)
        # The exposition is built in the background from now: the first scrape waits only for
        # what is left of it.
        app.state.metrics_cache.start()
        yield
        app.state.ingest_pool.shutdown()
        app.state.compute_pool.shutdown()
        app.state.page_pool.shutdown()
        app.state.metrics_cache.stop()
        app.state.engine.dispose()

    app = FastAPI(
        title="memest",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=_unique_id,
        # Swagger UI and ReDoc load from a CDN; /docs is a server-rendered page instead.
        docs_url=None,
        redoc_url=None,
        # Served below behind the read token, like /docs.
        openapi_url=None,
    )
    # A trailing-slash redirect would carry the Host header into its Location.
    app.router.redirect_slashes = False
    engine = db.make_engine(settings.database_url)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = db.make_sessionmaker(engine)
    app.state.report_cache = store.ReportCache(settings.report_cache_size)
    app.state.response_cache = store.ResponseCache(settings.report_cache_size)

    app.state.compute_pool = ComputePool(settings.compute_workers, settings.compute_deadline_s)
    # The model, compare and history pages' parse and render (memest.service.pages).
    app.state.page_pool = ComputePool(
        settings.page_workers,
        settings.compute_deadline_s,
        kind="page",
        workers_setting="MEMEST_PAGE_WORKERS",
    )
    app.state.failure_limiter = FailureLimiter()
    app.state.login_sessions = SessionStore(app.state.sessionmaker)
    app.state.metrics = ServiceMetrics()
    app.state.metrics_cache = MetricsCache(
        app.state.sessionmaker, app.state.report_cache.get, settings.metrics_max_stale_s
    )
    install_handlers(app)
    app.add_middleware(HardeningMiddleware, max_head_bytes=settings.max_header_bytes)
    if settings.trusted_proxies():
        # Outermost: the client address every limit counts is the one a trusted proxy forwards;
        # anyone else's X-Forwarded-For is ignored.
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxies())
    # Outermost of all: liveness answers before any other layer runs.
    app.add_middleware(LivenessMiddleware, max_head_bytes=settings.max_header_bytes)
    for router in (
        reports,
        models,
        runs,
        compare,
        calculators,
        preflight,
        health,
        dashboard,
        preflight_page,
        login,
    ):
        app.include_router(router.router)
    app.mount(
        "/static",
        StaticFiles(directory=str(resources.files("memest.service") / "static")),
        name="static",
    )

    @app.get("/openapi.json", include_in_schema=False, dependencies=[ReadAuth])
    async def openapi_document() -> JSONResponse:
        return JSONResponse(app.openapi())

    return app

"""POST /api/v1/reports: ingest one RunReport; GET one stored report."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker

from memest.schema import RunReport
from memest.service import examples, store
from memest.service.body import BodyRoute, JsonBody
from memest.service.deps import (
    CacheDep,
    FactoryDep,
    MetricsDep,
    PushAuth,
    ReadAuth,
    SessionDep,
)
from memest.service.errors import NotFound, ServiceError
from memest.service.ingest import IngestPool
from memest.service.metrics import ServiceMetrics
from memest.service.models import Report
from memest.service.schemas import IngestResponse


class ReportRoute(BodyRoute):
    """BodyRoute that counts a refused report body in memest_ingest_reports_total."""

    def refused(self, request: Request) -> None:
        metrics: ServiceMetrics = request.app.state.metrics
        metrics.ingested.labels(outcome="rejected").inc()


router = APIRouter(prefix="/api/v1/reports", tags=["reports"], route_class=ReportRoute)

ReportBody = Annotated[
    JsonBody[RunReport],
    Body(
        description="One rank's RunReport (schema version 1), as the vLLM plugin writes it",
        openapi_examples={"report": {"value": examples.REPORT}},
    ),
]


@router.post(
    "",
    response_model=IngestResponse,
    status_code=201,
    responses={
        200: {
            "description": "This report id is already stored with the same content (no change)",
            "content": {
                "application/json": {
                    "example": {
                        "status": "exists",
                        "report_id": examples.CHANGE.report_id,
                        "run_id": examples.CHANGE.run_id,
                    }
                }
            },
        },
        201: {
            "description": "Stored",
            "content": {
                "application/json": {
                    "example": {
                        "status": "created",
                        "report_id": examples.CHANGE.report_id,
                        "run_id": examples.CHANGE.run_id,
                    }
                }
            },
        },
        401: {"description": "Missing or wrong bearer token; nothing is stored"},
        409: {"description": "Same report id with other content, or the rank is taken"},
        413: {"description": "Body larger than MEMEST_MAX_REPORT_BYTES"},
        415: {"description": "Not application/json"},
        422: {
            "description": "Not a valid RunReport; `field` names the first field at fault",
            "content": {"application/json": {"example": examples.ERROR_422}},
        },
    },
    dependencies=[PushAuth],
)
async def ingest_report(
    report: ReportBody,
    request: Request,
    factory: FactoryDep,
    metrics: MetricsDep,
) -> Response:
    """Store one rank's RunReport, in one transaction.

    JSON only, at most MEMEST_MAX_REPORT_BYTES, schema version 1, with
    `Authorization: Bearer $MEMEST_PUSH_TOKEN` (or the admin MEMEST_WRITE_TOKEN). Idempotent by `report_id`: sending a stored report
    again answers 200 with `status: exists` and changes nothing; the same id with other content is
    a 409. Reports of one run must agree on model, build and world size.
    """
    try:
        # Preparing is CPU work and storing waits on locks: both run off the event loop, so that
        # reads and /healthz are served while a writer waits; and in few threads, since every
        # thread that wants the GIL delays the event loop by up to a switch interval.
        with request.app.state.metrics_cache.writing():
            result = await anyio.to_thread.run_sync(
                _prepare_and_store,
                report.raw,
                factory,
                request.app.state.ingest_pool,
                limiter=request.app.state.ingest_limiter,
            )
    except ServiceError:
        metrics.ingested.labels(outcome="rejected").inc()
        raise
    metrics.ingested.labels(outcome=result.status).inc()
    if result.status == "created":
        metrics.ingest_bytes.inc(len(report.raw))
    payload = IngestResponse(status=result.status, report_id=result.report_id, run_id=result.run_id)
    return JSONResponse(
        status_code=201 if result.status == "created" else 200, content=payload.model_dump()
    )


def _prepare_and_store(
    body: bytes, factory: sessionmaker[Session], pool: IngestPool
) -> store.IngestResult:
    # The CPU work (parse, validate, prepare) in a worker process (when MEMEST_INGEST_PROCESSES
    # > 0); this thread then only waits for it and for the write transaction.
    return store.store_prepared(factory, pool.prepare(body))


@router.get(
    "/{report_id}",
    response_model=RunReport,
    dependencies=[ReadAuth],
    responses={
        **examples.json_example(examples.REPORT, "The stored report"),
        404: {"description": "No such report"},
    },
)
def read_report(report_id: str, session: SessionDep, cache: CacheDep) -> RunReport:
    """One stored RunReport, exactly as ingested (after validation)."""
    row = session.get(Report, report_id)
    if row is None:
        raise NotFound(f"no report {report_id!r}", field="report_id")
    return cache.get(row)

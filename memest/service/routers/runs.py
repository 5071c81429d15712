"""Runs: filtered lists, one run with all ranks, one run's breakdown, one rank's report."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, Body, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from memest.analysis.ranks import rank_check
from memest.analysis.stages import stage_bars
from memest.builds.runs import build_label, run_facts, runner_counts
from memest.estimate import account, compare
from memest.reporters.views import notes
from memest.schema import RunReport
from memest.service import calculations, examples, store
from memest.service.body import BodyRoute, JsonBody
from memest.service.db import read_session
from memest.service.deps import (
    CacheDep,
    ComputeDep,
    FactoryDep,
    ReadAuth,
    ResponseCacheDep,
    SessionDep,
    WriteAuth,
)
from memest.service.errors import NotFound
from memest.service.estimates import RunEstimateRequest, RunEstimateResponse
from memest.service.models import Report, Run
from memest.service.routers.calculators import CALCULATOR_ANSWERS
from memest.service.schemas import (
    API_OWNERS_PER_STAGE,
    API_STAGES,
    BreakdownResponse,
    DeleteResponse,
    RankFacts,
    RunDetail,
    RunList,
    RunSummary,
)
from memest.service.store import ReportCache

router = APIRouter(
    prefix="/api/v1/runs", tags=["runs"], dependencies=[ReadAuth], route_class=BodyRoute
)

RunEstimateBody = Annotated[
    JsonBody[RunEstimateRequest],
    Body(openapi_examples={"smaller grid": {"value": examples.RUN_ESTIMATE_REQUEST}}),
]
RunIdPath = Annotated[
    str,
    Path(description="Run id (RunReport.run_id)", examples=["demo-deepseek-v4-flash-dspark-k7-pr"]),
]


def summary(run: Run, ranks: list[int]) -> RunSummary:
    return RunSummary(
        run_id=run.run_id,
        model=run.model,
        build=run.build_label,
        commit=run.vllm_commit,
        vllm_version=run.vllm_version,
        gpu=run.gpu_name,
        source=run.source,
        world_size=run.world_size,
        created_at=store._as_utc(run.created_at),
        ranks=ranks,
    )


@router.get(
    "",
    response_model=RunList,
    responses=examples.json_example({"data": [examples.RUN_SUMMARY], "count": 1}),
)
def list_runs(
    session: SessionDep,
    model: Annotated[
        str | None,
        Query(description="Exact model name", examples=["nvidia/MiniMax-M3-NVFP4"], max_length=300),
    ] = None,
    build: Annotated[
        str | None, Query(description="Build label", examples=["main"], max_length=200)
    ] = None,
    commit: Annotated[
        str | None,
        Query(description="vLLM commit or a prefix of it", examples=["60a7d568"], max_length=64),
    ] = None,
    gpu: Annotated[
        str | None, Query(description="GPU name", examples=["NVIDIA GB200"], max_length=200)
    ] = None,
    source: Annotated[
        str | None,
        Query(
            description="measured, published or synthetic", examples=["published"], max_length=32
        ),
    ] = None,
    since: Annotated[
        datetime | None,
        Query(description="Runs created at or after (ISO 8601)", examples=["2026-01-01T00:00:00Z"]),
    ] = None,
    until: Annotated[
        datetime | None,
        Query(
            description="Runs created at or before (ISO 8601)", examples=["2026-12-31T00:00:00Z"]
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size", examples=[50])] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9, description="Runs to skip", examples=[0])] = 0,
) -> RunList:
    """Runs, newest first, filtered by model, build label, commit prefix, GPU, source and date."""
    flt = store.RunFilter(
        model=model, build=build, commit=commit, gpu=gpu, since=since, until=until, source=source
    )
    runs, total = store.list_runs(session, flt, limit=limit, offset=offset)
    ranks = store.ranks_by_run(session, [r.run_id for r in runs])
    data = [summary(r, ranks[r.run_id]) for r in runs]
    return RunList(data=data, count=total)


@router.get(
    "/{run_id}",
    response_model=RunDetail,
    responses={**examples.json_example(examples.RUN_DETAIL), 404: {"description": "No such run"}},
)
def read_run(run_id: RunIdPath, session: SessionDep, cache: CacheDep) -> RunDetail:
    """One run: its accounting (the figures every surface shows), its breakdown (stage x owner)
    beside its capture plan's graph counts, per-rank figures and whether the ranks agree; the
    estimate block the plugin stored is kept as stored_estimate, superseded by accounting."""
    run = store.get_run(session, run_id)
    rows = store.run_reports(session, run_id)
    if not rows:  # a run whose reports are being deleted (never stored without one)
        raise NotFound(f"no run {run_id!r}", field="run_id")
    reports = [cache.get(r) for r in rows]
    lead = reports[0]
    computed, reason = None, None
    try:
        computed = compare(lead)
    except Exception as exc:  # the estimator rejects this report: show why, keep the page
        reason = f"memest.estimate.compare failed: {exc}"
    bd = lead.breakdown
    lead_notes = notes(lead)
    return RunDetail(
        run=summary(run, [r.rank for r in reports]),
        lead_rank=lead.rank,
        accounting=account(lead),
        facts=run_facts(lead),
        phases=bd.phases if bd else [],
        stages=stage_bars(lead, max_owners=API_OWNERS_PER_STAGE, max_stages=API_STAGES),
        runners=runner_counts(lead),
        capture_plans=lead.capture_plans,
        live_peaks=bd.live_peaks if bd else [],
        retained=bd.retained if bd else [],
        stored_estimate=lead.estimate,
        computed_estimate=computed,
        computed_estimate_unavailable=reason,
        rank_check=rank_check(reports),
        ranks=[RankFacts(rank=r.rank, report_id=r.report_id, facts=run_facts(r)) for r in reports],
        notes=lead_notes.main,
        diagnostics=lead_notes.diagnostics,
        hook_errors=lead.hook_errors,
    )


@router.get(
    "/{run_id}/breakdown",
    response_model=BreakdownResponse,
    responses={**examples.json_example(examples.BREAKDOWN), 404: {"description": "No such run"}},
)
async def read_breakdown(
    run_id: RunIdPath,
    factory: FactoryDep,
    cache: CacheDep,
    responses: ResponseCacheDep,
    rank: Annotated[
        int | None,
        Query(ge=0, le=65535, description="Rank (default: the lowest stored)", examples=[0]),
    ] = None,
) -> Response:
    """One rank's breakdown of a run: phase split, stage growth, owners, peaks, retained rows."""
    body = await run_in_threadpool(_breakdown_body, factory, cache, responses, run_id, rank)
    return Response(content=body, media_type="application/json")


def _breakdown_body(
    factory: sessionmaker[Session],
    cache: ReportCache,
    responses: store.ResponseCache,
    run_id: str,
    rank: int | None,
) -> bytes:
    """The body for the stored report the database names now: bodies are cached by the report's
    id and content digest, so a report deleted or stored again is never answered from the
    cache with its old content."""
    with read_session(factory) as session:
        ranks = store.report_keys(session, run_id)
        if not ranks:
            raise NotFound(f"no run {run_id!r}", field="run_id")
        if rank is not None:
            ranks = [r for r in ranks if r[1] == rank]
            if not ranks:
                raise NotFound(f"run {run_id!r} has no rank {rank}", field="rank")
        report_id, _, digest = ranks[0]
        key = (run_id, report_id, digest)
        hit = responses.get(key)
        if hit is not None:
            return hit
        row = session.get(Report, report_id)
        if row is None:
            raise NotFound(f"no run {run_id!r}", field="run_id")
        rep = cache.get(row)
    body = _breakdown_json(rep)
    responses.put(key, body)
    return body


def _breakdown_json(rep: RunReport) -> bytes:
    out = BreakdownResponse(
        run_id=rep.run_id,
        rank=rep.rank,
        model=rep.model,
        build=build_label(rep),
        breakdown=rep.breakdown,
        stages=stage_bars(rep, max_owners=API_OWNERS_PER_STAGE, max_stages=API_STAGES),
    )
    return out.model_dump_json().encode()


@router.get(
    "/{run_id}/ranks/{rank}",
    response_model=RunReport,
    responses={**examples.json_example(examples.REPORT), 404: {"description": "No such rank"}},
)
def read_rank(
    run_id: RunIdPath,
    rank: Annotated[int, Path(ge=0, le=65535, description="Rank", examples=[0])],
    session: SessionDep,
    cache: CacheDep,
) -> RunReport:
    """The stored RunReport of one rank of a run."""
    for row in store.run_reports(session, run_id):
        if row.rank == rank:
            return cache.get(row)
    raise NotFound(f"run {run_id!r} has no rank {rank}", field="rank")


@router.delete(
    "/{run_id}",
    response_model=DeleteResponse,
    dependencies=[WriteAuth],
    responses={
        200: {
            "description": "Deleted, with its reports",
            "content": {
                "application/json": {
                    "example": {
                        "status": "deleted",
                        "run_id": examples.CHANGE.run_id,
                        "report_ids": [examples.CHANGE.report_id],
                    }
                }
            },
        },
        401: {"description": "Missing or wrong bearer token; nothing is deleted"},
        404: {"description": "No such run"},
    },
)
def delete_run(
    run_id: RunIdPath,
    request: Request,
    factory: FactoryDep,
    cache: CacheDep,
    responses: ResponseCacheDep,
) -> DeleteResponse:
    """Delete a run and all its reports (write token). Its ids may then be stored again."""
    report_ids = store.delete_run(factory, run_id)
    cache.drop(report_ids)
    responses.drop_run(run_id)
    request.app.state.metrics_cache.deleted()
    return DeleteResponse(status="deleted", run_id=run_id, report_ids=report_ids)


@router.post(
    "/{run_id}/estimate",
    response_model=RunEstimateResponse,
    responses={
        **examples.json_example(examples.RUN_ESTIMATE, "Every term and the KV budget at G'"),
        **CALCULATOR_ANSWERS,
        404: {"description": "No such run or rank"},
    },
)
async def estimate_run(
    run_id: RunIdPath,
    body: RunEstimateBody,
    request: Request,
    factory: FactoryDep,
    pool: ComputeDep,
) -> Response:
    """What-if on a stored run: memest's KV budget, tokens and concurrency under grid G' (the
    changes ``memest estimate --grid`` takes), each term at G and G' with its law, and the
    inverse questions (kv_tokens / concurrency), by memest.estimate, in a calculator worker.
    Every refusal is a 4xx {"detail", "field"} naming the request field."""
    payloads = await anyio.to_thread.run_sync(
        _stored_payloads, factory, run_id, limiter=request.app.state.estimate_reads
    )
    answer = await pool.run(calculations.run_estimate_json, run_id, payloads, body.raw)
    return Response(answer, media_type="application/json")


def _stored_payloads(factory: sessionmaker[Session], run_id: str) -> dict[int, str]:
    """The stored JSON of each rank of a run: the worker parses the one the request names
    (parsing it here would hold the server's GIL)."""
    with read_session(factory) as session:
        rows = store.run_reports(session, run_id)
        if not rows:
            raise NotFound(f"no run {run_id!r}", field="run_id")
        return {row.rank: row.payload for row in rows}

"""Server-rendered dashboard: model page, compare page, history page (SVG plots, no CDN)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

import anyio
import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from memest.builds.runs import run_facts
from memest.service import pages, store
from memest.service.compute import ComputePool
from memest.service.db import read_session
from memest.service.deps import CacheDep, FactoryDep, ReadAuth, ResponseCacheDep, SessionDep
from memest.service.errors import NotFound
from memest.service.models import Report, Run
from memest.service.page_cache import EntryCache
from memest.service.pages import PAGE_COMPARE_ROWS, PAGE_STAGES, PageView, RunRow, StoredReport
from memest.service.pages import capped_rows as _capped_rows
from memest.service.templating import HTML_PAGE, templates

# The pages' caps, where the page tests name them with the routes.
__all__ = ["PAGE_COMPARE_ROWS", "PAGE_STAGES", "_capped_rows", "router"]

router = APIRouter(tags=["dashboard"], dependencies=[ReadAuth])


#: Models listed per home page (by name; ?offset= pages on).
INDEX_MODELS = 100


class PageJob(NamedTuple):
    """A page to build in a page worker (memest.service.pages): the function and its arguments,
    and the key its body is kept under in the response cache."""

    key: tuple[Any, ...]
    build: Callable[..., bytes]
    args: tuple[Any, ...]


async def _page_build(
    request: Request, read: Callable[..., bytes | PageJob], *args: Any
) -> HTMLResponse:
    """``read(*args)`` in a thread (the database reads; a cached body, or the page to build),
    then the build in a page worker, all within one worker's turn and MEMEST_COMPUTE_DEADLINE_S:
    the requests for a page being built wait for a turn and then find it cached."""
    pool: ComputePool = request.app.state.page_pool
    async with pool.slot() as slot:
        job = await anyio.to_thread.run_sync(read, *args)
        if isinstance(job, bytes):
            return HTMLResponse(job)
        body = await slot.run(job.build, *job.args)
    responses: store.ResponseCache = request.app.state.response_cache
    responses.put(job.key, body)
    return HTMLResponse(body)


def page_view(request: Request) -> PageView:
    """What a page takes from its request: the login cookie's presence, the root path, the
    app's routes (kept per app)."""
    state = request.app.state
    if not hasattr(state, "page_routes"):
        state.page_routes = pages.route_table(request.app.routes)
    return PageView(
        logged_in=bool(request.cookies.get("memest_session")),
        root_path=str(request.scope.get("root_path", "")),
        routes=state.page_routes,
    )


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context)


@router.get("/", response_class=HTMLResponse, responses=HTML_PAGE)
def index(
    request: Request,
    session: SessionDep,
    cache: CacheDep,
    offset: Annotated[
        int, Query(ge=0, le=10**9, description="Models to skip (by name)", examples=[0])
    ] = 0,
) -> HTMLResponse:
    """Dashboard home: the models with their runs, build labels and their newest run's figures,
    INDEX_MODELS at a time."""
    models, total = store.list_models(session, limit=INDEX_MODELS, offset=offset)
    runs, _ = store.list_runs(session, store.RunFilter(), limit=20, offset=0)
    newest = {
        m.model: run_facts(cache.get(store.lead_report(session, m.latest_run_id))) for m in models
    }
    return _page(
        request,
        "index.html",
        models=models,
        total=total,
        offset=offset,
        step=INDEX_MODELS,
        runs=runs,
        newest=newest,
        title="memest",
    )


@router.get(
    "/models/{model:path}",
    response_class=HTMLResponse,
    responses={**HTML_PAGE, 404: {"description": "No such model or run"}},
)
async def model_page(
    request: Request,
    model: str,
    factory: FactoryDep,
    responses: ResponseCacheDep,
    run: Annotated[
        str | None,
        Query(
            description="Run to show (default: the newest)",
            examples=["demo-deepseek-v4-flash-dspark-k7-pr"],
            max_length=200,
        ),
    ] = None,
) -> HTMLResponse:
    """A model's page: stacked bars of added pool memory per stage and owner beside the graph-count
    table of the capture plan, the phase split, estimates, and the model's runs."""
    return await _page_build(
        request, _model_page_read, request, model, factory, responses, run, page_view(request)
    )


def _model_page_read(
    request: Request,
    model: str,
    factory: sessionmaker[Session],
    responses: store.ResponseCache,
    run: str | None,
    view: PageView,
) -> bytes | PageJob:
    # Every read in one snapshot (read_session): a run deleted meanwhile is whole or gone, so
    # the page is the old one or a 404, never half a run (a 500). The session is closed before
    # the page is built: no connection (or PostgreSQL snapshot) is held while it renders.
    with read_session(factory) as session:
        key, runs, chosen = _model_page_key(request, model, session, run)
        body = responses.get(key)
        if body is not None:
            return body
        rows = store.run_reports(session, chosen.run_id)
        if not rows:  # deleted before this snapshot began, after its run row was read elsewhere
            raise NotFound(f"no run {chosen.run_id!r}", field="run")
        stored = [_stored(r) for r in rows]
    listed = [_run_row(r) for r in runs]
    return PageJob(key, pages.model_page_html, (view, model, listed, _run_row(chosen), stored))


def _stored(row: Report) -> StoredReport:
    return StoredReport(row.report_id, row.payload_sha256, row.payload)


def _run_row(run: Run) -> RunRow:
    return RunRow(run.run_id, run.build_label, run.vllm_version, run.vllm_commit, run.created_at)


def _model_page_key(
    request: Request, model: str, session: Session, run: str | None
) -> tuple[tuple[Any, ...], list[Run], Run]:
    """The model's runs, the one shown, and the key of its cached page: everything the page
    shows, as stored (the shown run's reports by id and content digest, the listed runs' fixed
    fields) and what the request itself changes (logout button, root path). A report deleted or
    stored again is another key, so a cached page is never stale."""
    runs = store.model_runs(session, model)
    chosen = runs[-1] if run is None else next((r for r in runs if r.run_id == run), None)
    if chosen is None:
        raise NotFound(f"model {model!r} has no run {run!r}", field="run")
    key = (
        chosen.run_id,
        "model-page",
        model,
        tuple(store.report_keys(session, chosen.run_id)),
        tuple((r.run_id, r.build_label, r.vllm_version, r.vllm_commit, r.created_at) for r in runs),
        bool(request.cookies.get("memest_session")),
        str(request.scope.get("root_path", "")),
    )
    return key, runs, chosen


@router.get(
    "/compare",
    response_class=HTMLResponse,
    responses={**HTML_PAGE, 404: {"description": "One of the runs does not exist"}},
)
async def compare_page(
    request: Request,
    factory: FactoryDep,
    responses: ResponseCacheDep,
    a: Annotated[
        str,
        Query(
            description="Baseline run id",
            examples=["demo-deepseek-v4-flash-dspark-k7-main"],
            max_length=200,
        ),
    ],
    b: Annotated[
        str,
        Query(
            description="Changed run id",
            examples=["demo-deepseek-v4-flash-dspark-k7-pr"],
            max_length=200,
        ),
    ],
) -> HTMLResponse:
    """Two runs side by side, in the seed's "main → PR" layout."""
    return await _page_build(
        request, _compare_page_read, request, factory, responses, a, b, page_view(request)
    )


def _compare_page_read(
    request: Request,
    factory: sessionmaker[Session],
    responses: store.ResponseCache,
    a: str,
    b: str,
    view: PageView,
) -> bytes | PageJob:
    with read_session(factory) as session:
        # The page shows the two lead reports (by id and content digest, so a report deleted or
        # stored again is another key) and what the request changes (logout button, root path).
        leads = [store.report_keys(session, run_id)[:1] for run_id in (a, b)]
        key = (
            "compare-page",
            a,
            b,
            tuple(leads[0]),
            tuple(leads[1]),
            bool(request.cookies.get("memest_session")),
            str(request.scope.get("root_path", "")),
        )
        if all(leads):
            body = responses.get(key)
            if body is not None:
                return body
        stored_a = _stored(store.lead_report(session, a))
        stored_b = _stored(store.lead_report(session, b))
    return PageJob(key, pages.compare_page_html, (view, a, b, stored_a, stored_b))


@router.get(
    "/history/{model:path}",
    response_class=HTMLResponse,
    responses={**HTML_PAGE, 404: {"description": "No such model, or no such page"}},
)
async def history_page(
    request: Request,
    model: str,
    factory: FactoryDep,
    responses: ResponseCacheDep,
    page: Annotated[
        int,
        Query(ge=1, le=10**6, description="1: the newest runs; 2: the ones before", examples=[1]),
    ] = 1,
) -> HTMLResponse:
    """A model's builds over time, HISTORY_PAGE_RUNS runs a page: KV tokens, graph-pool bytes
    and each start's usage − budget, with the regressions against the previous build of the same
    configuration and KV sizing highlighted."""
    pool: ComputePool = request.app.state.page_pool
    view = page_view(request)
    async with pool.slot() as slot:
        job = await anyio.to_thread.run_sync(
            _history_page_read, request, model, factory, responses, page
        )
        if isinstance(job, bytes):
            return HTMLResponse(job)
        built = await slot.run(
            pages.history_page_html,
            *(view, model, page, job.history_key, job.history, job.known, job.missing),
        )
    # Whatever the worker built is kept, also for a page past the last one.
    entries = _entry_cache(request)
    for report_id, entry in built.entries.items():
        entries.put(job.leads[report_id], entry)
    if built.history is not None:
        entries.put(job.history_key, built.history)
    if built.html is None:
        raise NotFound(f"history of {model!r} has {built.pages} page(s), not {page}", field="page")
    responses.put(job.key, built.html)
    return HTMLResponse(built.html)


class HistoryJob(NamedTuple):
    """A history page to build: its response cache key, the key of the model's history and
    that history (JSON) when the entry cache has it, else the entries it has (JSON) and the
    lead reports it lacks, with the key each one's entry is kept under."""

    key: tuple[Any, ...]
    history_key: tuple[Any, ...]
    history: bytes | None
    known: list[bytes]
    missing: list[StoredReport]
    leads: dict[str, tuple[str, str]]


def _history_page_read(
    request: Request,
    model: str,
    factory: sessionmaker[Session],
    responses: store.ResponseCache,
    page: int,
) -> bytes | HistoryJob:
    with read_session(factory) as session:  # one snapshot: a run deleted meanwhile is whole or gone
        stored = _model_state(session, model)
        # The page changes only when the model's runs or reports do (stored says so), and with
        # the request's own parts (logout button, root path).
        key = (
            "history-page",
            model,
            page,
            stored,
            bool(request.cookies.get("memest_session")),
            str(request.scope.get("root_path", "")),
        )
        body = responses.get(key)
        if body is not None:
            return body
        entries = _entry_cache(request)
        history_key = ("history", model, stored)
        hist = entries.get(history_key)
        if hist is not None:
            return HistoryJob(key, history_key, hist, [], [], {})
        runs = store.model_runs(session, model)
        leads = store.lead_keys(session, [r.run_id for r in runs])
        known, missing = _history_entries(request, session, leads)
    by_report = {lead[0]: lead for lead in leads.values()}
    return HistoryJob(key, history_key, None, known, missing, by_report)


def _model_state(session: Session, model: str) -> tuple[int, str, int, int]:
    """What changes whenever a model's runs or reports do: its runs, the newest run's ingest
    time (a run deleted and stored again is newer), its reports and their ranks (a rank added
    to a run). Only columns stored ahead of a report's payload are read (SQLite then never
    reads the payload's pages)."""
    runs, newest = session.execute(
        select(func.count(Run.run_id), func.max(Run.ingested_at)).where(Run.model == model)
    ).one()
    if not runs:
        raise NotFound(f"no runs of model {model!r}", field="model")
    reports, ranks = session.execute(
        select(func.count(Report.run_id), func.coalesce(func.sum(Report.rank), 0))
        .join(Run, Report.run_id == Run.run_id)
        .where(Run.model == model)
    ).one()
    return runs, str(newest), reports, ranks


def _history_entries(
    request: Request,
    session: Session,
    leads: dict[str, tuple[str, str]],
) -> tuple[list[bytes], list[StoredReport]]:
    """The runs' history entries in the app's entry cache (JSON), and the lead reports of the
    others (read in bulk; a worker parses them). Entries are kept per lead report (its id and
    its run's ingest time, which name one content): far smaller than a parsed report, so
    thousands of runs stay cached and only the reports not seen yet are read."""
    entries = _entry_cache(request)
    found = {lead: entries.get(lead) for lead in leads.values()}
    known = [hit for hit in found.values() if hit is not None]
    missing_ids = [lead[0] for lead, hit in found.items() if hit is None]
    missing: list[StoredReport] = []
    for chunk in (missing_ids[i : i + 500] for i in range(0, len(missing_ids), 500)):
        for row in session.scalars(select(Report).where(Report.report_id.in_(chunk))):
            lead = leads.get(row.run_id)
            if lead is not None and lead[0] == row.report_id:
                missing.append(_stored(row))
    return known, missing


#: History entries kept per app (each a few kB of JSON), and the models' whole histories.
HISTORY_ENTRIES = 50_000


def _entry_cache(request: Request) -> EntryCache[bytes]:
    """The app's history entries and histories as JSON (memest.service.pages.HistoryBuild)."""
    state = request.app.state
    if not hasattr(state, "history_entries"):
        state.history_entries = EntryCache[bytes](HISTORY_ENTRIES)
    entries: EntryCache[bytes] = state.history_entries
    return entries


@router.get("/docs", response_class=HTMLResponse, responses=HTML_PAGE)
def api_docs(request: Request) -> HTMLResponse:
    """API reference rendered from the OpenAPI document (works offline; JSON at /openapi.json)."""
    spec = request.app.openapi()
    ops = []
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            example = None
            for status in ("200", "201"):
                content = op.get("responses", {}).get(status, {}).get("content", {})
                for media in content.values():
                    if "example" in media:
                        example = media["example"]
                        break
                if example is not None:
                    break
            text = json.dumps(example, indent=2) if not isinstance(example, str) else example
            if text and len(text) > 2400:
                text = text[:2400] + "\n…"
            ops.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "tag": (op.get("tags") or [""])[0],
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "parameters": op.get("parameters", []),
                    "body": "requestBody" in op,
                    "responses": {k: v.get("description", "") for k, v in op["responses"].items()},
                    "example": text if example is not None else None,
                }
            )
    return _page(request, "docs.html", title="API · memest", ops=ops, info=spec["info"])

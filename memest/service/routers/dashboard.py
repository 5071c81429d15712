"""Server-rendered dashboard: model page, compare page, history page (SVG plots, no CDN)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote

import anyio
import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from memest.analysis.ranks import rank_check
from memest.analysis.stages import stage_bars
from memest.builds.compare import Comparison, Delta
from memest.builds.history import (
    History,
    HistoryEntry,
    history_entry,
    history_of,
    history_pages,
    history_window,
)
from memest.builds.runs import (
    RunFacts,
    build_label,
    config_summary,
    fingerprint,
    run_facts,
    runner_counts,
)
from memest.errors import MemestError
from memest.estimate import account, budget_splits, gpu_parts
from memest.estimate.phases import total_bytes
from memest.reporters import plots, plots_gpu, plots_history
from memest.reporters.growable import growable_table
from memest.reporters.kv_groups import kv_groups_table
from memest.reporters.recommend import recommendation
from memest.reporters.regression import (
    KV_FIGURES,
    PAGE_THRESHOLDS,
    RUN_TO_RUN_SPREAD,
    VERDICT_WORDS,
    mode_of,
    page_verdict,
)
from memest.reporters.table import to_html
from memest.reporters.views import (
    NEGATIVE_NOTE,
    NESTED_NOTE,
    compare,
    definition_line,
    model_name,
    notes,
    phase_rows,
)
from memest.schema import RunReport, StartAccounting
from memest.service import store
from memest.service.db import read_session
from memest.service.deps import CacheDep, FactoryDep, ReadAuth, ResponseCacheDep, SessionDep
from memest.service.errors import NotFound
from memest.service.models import Report, Run
from memest.service.page_cache import EntryCache
from memest.service.templating import HTML_PAGE, templates

router = APIRouter(tags=["dashboard"], dependencies=[ReadAuth])


#: Models listed per home page (by name; ?offset= pages on).
INDEX_MODELS = 100
#: Stage bars on the model page: the stages of most pool growth, the rest summed as one "other"
#: stage, and a stage's largest owners, the rest as "other" (a report of 38,000 stages made a
#: 47 MB page); the run API has more (memest.service.schemas.API_STAGES).
PAGE_STAGES = 24
PAGE_OWNERS_PER_STAGE = 10
#: Live-peak and retained rows shown on the model page (largest first); the API has them all.
TOP_ROWS = 15
#: Rows below this many bytes read 0.000 GiB: left off the page's peak and retained table.
SHOWN_MIN_BYTES = 512 * 1024

#: Pages built at once (threads that parse reports and render): a parse of a large stored report
#: is one call that holds the GIL throughout, so every build running beside the event loop
#: delays it; the rest wait here, and most then find their page (or its reports) cached.
PAGE_BUILDS = 1


async def _page_build(
    request: Request, build: Callable[..., HTMLResponse], *args: Any
) -> HTMLResponse:
    state = request.app.state
    if not hasattr(state, "page_builds"):
        state.page_builds = anyio.CapacityLimiter(PAGE_BUILDS)
    return await anyio.to_thread.run_sync(build, *args, limiter=state.page_builds)


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
    cache: CacheDep,
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
        request, _model_page_now, request, model, factory, cache, responses, run
    )


def _model_page_now(
    request: Request,
    model: str,
    factory: sessionmaker[Session],
    cache: store.ReportCache,
    responses: store.ResponseCache,
    run: str | None,
) -> HTMLResponse:
    # Every read in one snapshot (read_session): a run deleted meanwhile is whole or gone, so
    # the page is the old one or a 404, never half a run (a 500). The session, opened here in
    # the route's one thread-pool call, is closed before the page is built: no connection (or
    # PostgreSQL snapshot) is held while it renders.
    with read_session(factory) as session:
        key, runs, chosen = _model_page_key(request, model, session, run)
        body = responses.get(key)
        if body is not None:
            return HTMLResponse(body)
        rows = store.run_reports(session, chosen.run_id)
        if not rows:  # deleted before this snapshot began, after its run row was read elsewhere
            raise NotFound(f"no run {chosen.run_id!r}", field="run")
        reports = [cache.get(r) for r in rows]
    page = _model_page(request, model, runs, chosen, reports)
    responses.put(key, bytes(page.body))
    return page


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


def _model_page(
    request: Request,
    model: str,
    runs: list[Run],
    chosen: Run,
    all_ranks: list[RunReport],
) -> HTMLResponse:
    rep = all_ranks[0]
    accounting = account(rep)
    facts = run_facts(rep)
    bd = rep.breakdown
    bars = stage_bars(rep, max_owners=PAGE_OWNERS_PER_STAGE, max_stages=PAGE_STAGES)
    runners = runner_counts(rep)
    peaks = [r for r in bd.live_peaks if r.peak_bytes >= SHOWN_MIN_BYTES] if bd else []
    retained = [r for r in bd.retained if r.bytes >= SHOWN_MIN_BYTES] if bd else []
    return _page(
        request,
        "model.html",
        title=f"{model_name(model)} · memest",
        model=model,
        run=chosen,
        runs=runs,
        report=rep,
        build=build_label(rep),
        config=config_summary(rep.config),
        fingerprint=fingerprint(rep),
        ranks=[r.rank for r in all_ranks],
        rank_check=rank_check(all_ranks),
        peaks=sorted(peaks, key=lambda r: -r.peak_bytes)[:TOP_ROWS],
        retained=sorted(retained, key=lambda r: -r.bytes)[:TOP_ROWS],
        hidden_rows=(len(bd.live_peaks) + len(bd.retained)) if bd else 0,
        bars=bars,
        runners=runners[:PAGE_STAGES],
        runners_left_off=max(len(runners) - PAGE_STAGES, 0),
        facts=facts,
        accounting=accounting,
        rec=recommendation(accounting),
        kv_groups_html=_kv_groups_html(accounting),
        growable_html=_growable_html(accounting),
        phases=phase_rows(bd.phases, rep.phases) if bd else [],
        negative_note=NEGATIVE_NOTE,
        definition_line=definition_line(rep, accounting),
        nested_note=NESTED_NOTE,
        notes=notes(rep),
        gpu_svg=_whole_gpu(rep, accounting, facts.kv_sized_by),
        svg=plots.stage_owner_svg(bars, "Graph-pool growth by capture stage and owner")
        if bars
        else None,
    )


def _kv_groups_html(accounting: StartAccounting) -> str | None:
    """A hybrid start's KV cache per group (tokens and share of the budget), or None."""
    table = kv_groups_table(accounting.kv_groups, accounting.max_model_len)
    return to_html([table]) if table is not None else None


def _growable_html(accounting: StartAccounting) -> str | None:
    """vLLM 0.34's growable KV cache beside memest's terms (margin used), or None."""
    table = growable_table(accounting.growable_kv)
    return to_html([table]) if table is not None else None


def _whole_gpu(report: RunReport, accounting: StartAccounting, sized_by: str | None) -> str | None:
    """The whole-GPU bar of a run with vLLM's and memest's split of the budget under it, or None
    when its accounting has no terms."""
    try:
        total = total_bytes(report)
    except MemestError:
        return None
    parts = gpu_parts(accounting, total)
    if not parts:
        return None
    return plots_gpu.whole_gpu_svg(
        parts,
        total_bytes=total,
        budget_bytes=accounting.budget_bytes,
        usage_bytes=accounting.usage_bytes,
        splits=budget_splits(accounting),
        sized_by=sized_by,
    )


@router.get(
    "/compare",
    response_class=HTMLResponse,
    responses={**HTML_PAGE, 404: {"description": "One of the runs does not exist"}},
)
async def compare_page(
    request: Request,
    factory: FactoryDep,
    cache: CacheDep,
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
    return await _page_build(request, _compare_page_now, request, factory, cache, a, b)


def _compare_page_now(
    request: Request, factory: sessionmaker[Session], cache: store.ReportCache, a: str, b: str
) -> HTMLResponse:
    with read_session(factory) as session:
        ra = cache.get(store.lead_report(session, a))
        rb = cache.get(store.lead_report(session, b))
    cmp = compare(ra, rb)
    shown, more = _capped_rows(cmp)
    return _page(
        request,
        "compare.html",
        shown=shown,
        more=more,
        api_compare=f"/api/v1/compare?a={quote(a, safe='')}&b={quote(b, safe='')}",
        title=f"{model_name(ra.model)}: {cmp.a_name} → {cmp.b_name} · memest",
        cmp=cmp,
        ra=ra,
        rb=rb,
        verdicts=_compare_verdicts(run_facts(ra), run_facts(rb)),
        thresholds=PAGE_THRESHOLDS,
        verdict_words=VERDICT_WORDS,
        noise_bytes=RUN_TO_RUN_SPREAD,
        svg=plots.compare_svg(cmp.model_copy(update={"stages": shown["stages"]})),
    )


#: Rows of each stage and owner table the compare page shows: those that changed most (a
#: report of 80,000 stages made a 112 MB page); the comparison's JSON has every row.
PAGE_COMPARE_ROWS = 30


def _capped_rows(cmp: Comparison) -> tuple[dict[str, list[Delta]], dict[str, int]]:
    """Per long table, the PAGE_COMPARE_ROWS rows that changed most (in their order; the total
    row kept), and how many rows are left off."""
    shown: dict[str, list[Delta]] = {}
    more: dict[str, int] = {}
    for name in ("owners", "stages", "stage_graph_counts"):
        rows: list[Delta] = getattr(cmp, name)
        if len(rows) <= PAGE_COMPARE_ROWS:
            shown[name], more[name] = rows, 0
            continue
        ranked = sorted(
            range(len(rows)),
            key=lambda i: (rows[i].key != "total", -abs(rows[i].delta or 0)),
        )
        keep = sorted(ranked[:PAGE_COMPARE_ROWS])
        shown[name], more[name] = [rows[i] for i in keep], len(rows) - len(keep)
    return shown, more


def _compare_verdicts(fa: RunFacts, fb: RunFacts) -> dict[str, dict[str, Any]]:
    """Figure -> its before, after and verdict (memest.reporters.regression's policy, the one
    `memest check` applies), for the figures a regression is judged on."""
    figures = {
        "kv_tokens": (fa.kv_tokens, fb.kv_tokens),
        "kv_cache_bytes": (fa.kv_cache_bytes, fb.kv_cache_bytes),
        "non_kv_bytes": (fa.non_kv_bytes, fb.non_kv_bytes),
        "graph_pool_bytes": (fa.graph_pool_bytes, fb.graph_pool_bytes),
    }
    other_mode = mode_of(fa.kv_sized_by) != mode_of(fb.kv_sized_by)
    out: dict[str, dict[str, Any]] = {}
    for key, (a, b) in figures.items():
        judged = page_verdict(key, a, b)
        if judged is not None and other_mode and key in KV_FIGURES:
            judged = "other_mode"  # an apply start holds less KV than an enable one by design
        out[key] = {"a": a, "b": b, "verdict": judged}
    return out


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
    return await _page_build(request, _history_page_now, request, model, factory, responses, page)


def _history_page_now(
    request: Request,
    model: str,
    factory: sessionmaker[Session],
    responses: store.ResponseCache,
    page: int,
) -> HTMLResponse:
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
            return HTMLResponse(body)
        hist = _history(request, session, model, stored)
    pages = history_pages(hist)
    if page > pages:
        raise NotFound(f"history of {model!r} has {pages} page(s), not {page}", field="page")
    window = history_window(hist, page)
    answer = _page(
        request,
        "history.html",
        title=f"{model_name(model)} history · memest",
        model=model,
        hist=window,
        total_runs=len(hist.points),
        total_configs=len(hist.configs),
        page=page,
        pages=pages,
        numbers={p.run_id: i for i, p in enumerate(hist.points, start=1)},
        svgs=plots_history.history_svgs(window),
        legend=plots_history.config_legends(window),
    )
    responses.put(key, bytes(answer.body))
    return answer


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


def _history(
    request: Request,
    session: Session,
    model: str,
    stored: tuple[int, str, int, int],
) -> History:
    """The model's whole history for this stored state, kept in the app's entry cache (a page
    is a window of it)."""
    entries = _entry_cache(request)
    key = ("history", model, stored)
    hist = entries.get(key)
    if not isinstance(hist, History):
        runs = store.model_runs(session, model)
        leads = store.lead_keys(session, [r.run_id for r in runs])
        hist = history_of(model, _history_entries(request, session, leads))
        entries.put(key, hist)
    return hist


def _history_entries(
    request: Request,
    session: Session,
    leads: dict[str, tuple[str, str]],
) -> list[HistoryEntry]:
    """Each run's history entry, kept per lead report (its id and its run's ingest time, which
    name one content) in the app's entry cache: far smaller than a parsed report, so thousands
    of runs stay cached and only the reports not seen yet are read, in bulk."""
    entries = _entry_cache(request)
    found = {lead: entries.get(lead) for lead in leads.values()}
    missing = [lead[0] for lead, hit in found.items() if not isinstance(hit, HistoryEntry)]
    for chunk in (missing[i : i + 500] for i in range(0, len(missing), 500)):
        for row in session.scalars(select(Report).where(Report.report_id.in_(chunk))):
            lead = leads.get(row.run_id)
            if lead is not None and lead[0] == row.report_id:
                # Parsed here, not through the report cache: a history of thousands of runs
                # would fill it with reports no page shows (and the collector with their objects).
                entry = history_entry(RunReport.model_validate_json(row.payload))
                found[lead] = entry
                entries.put(lead, entry)
    return [hit for hit in found.values() if isinstance(hit, HistoryEntry)]


#: History entries kept per app (each a few hundred bytes).
HISTORY_ENTRIES = 50_000


def _entry_cache(request: Request) -> EntryCache[HistoryEntry | History]:
    state = request.app.state
    if not hasattr(state, "history_entries"):
        state.history_entries = EntryCache[HistoryEntry | History](HISTORY_ENTRIES)
    entries: EntryCache[HistoryEntry | History] = state.history_entries
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

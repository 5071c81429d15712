"""The CPU work of the model, compare and history pages (report parse, comparison, history,
render), run in the page workers (MEMEST_PAGE_WORKERS, a memest.service.compute.ComputePool):
a parse of a large stored report or a comparison of thousands of rows is one call that holds
the GIL, which in a thread of the server delays its event loop and /healthz.

The server's thread reads the rows (memest.service.routers.dashboard) and hands a worker only
what a page shows: the stored reports' JSON text (StoredReport), the listed runs' fixed fields
(RunRow) and what the request changes (PageView); the worker answers the page's HTML bytes.
A worker then needs no database engine or session of its own, so SQLite and PostgreSQL serve the
same, and every read of a page stays in the one snapshot the route opens (a run deleted
meanwhile is whole or gone). A worker keeps the reports it parsed (WORKER_REPORTS, by id and
content digest), so the pages of one run parse it once per worker.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import quote

from pydantic import TypeAdapter
from starlette.routing import BaseRoute, Mount, Route, Router

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
from memest.service.page_cache import EntryCache
from memest.service.templating import templates

#: Stage bars on the model page: the stages of most pool growth, the rest summed as one "other"
#: stage, and a stage's largest owners, the rest as "other" (a report of 38,000 stages made a
#: 47 MB page); the run API has more (memest.service.schemas.API_STAGES).
PAGE_STAGES = 24
PAGE_OWNERS_PER_STAGE = 10
#: Live-peak and retained rows shown on the model page (largest first); the API has them all.
TOP_ROWS = 15
#: Rows below this many bytes read 0.000 GiB: left off the page's peak and retained table.
SHOWN_MIN_BYTES = 512 * 1024
#: Rows of each stage and owner table the compare page shows: those that changed most (a
#: report of 80,000 stages made a 112 MB page); the comparison's JSON has every row.
PAGE_COMPARE_ROWS = 30
#: Parsed reports a page worker keeps (reports are immutable; keyed by id and content digest).
WORKER_REPORTS = 32


class StoredReport(NamedTuple):
    """A stored report as a worker gets it: its id, content digest and JSON text."""

    report_id: str
    payload_sha256: str
    payload: str


class RunRow(NamedTuple):
    """The fields of a stored run that the model page lists."""

    run_id: str
    build_label: str
    vllm_version: str | None
    vllm_commit: str | None
    created_at: datetime


#: A route table as a worker rebuilds it: (name, path, is_mount) per named route.
RouteTable = tuple[tuple[str, str, bool], ...]


def route_table(routes: list[BaseRoute]) -> RouteTable:
    """The app's named routes and mounts, for the pages' links (url_for) in a worker."""
    table = []
    for route in routes:
        name, path = getattr(route, "name", None), getattr(route, "path", None)
        if isinstance(name, str) and isinstance(path, str):
            table.append((name, path, isinstance(route, Mount)))
    return tuple(table)


def _no_endpoint(*_: object) -> None:  # never called: the worker's routes only build paths
    raise RuntimeError("a page worker's route is for links only")


@functools.lru_cache(maxsize=4)
def _router(table: RouteTable) -> Router:
    return Router(
        [
            Mount(path, routes=[], name=name)
            if mount
            else Route(path, endpoint=_no_endpoint, name=name)
            for name, path, mount in table
        ]
    )


@dataclass(frozen=True)
class PageView:
    """What a page takes from its request (a logout button, the root path, the app's routes for
    links), in the shape the templates read a Request: picklable, no headers or tokens."""

    logged_in: bool
    root_path: str
    routes: RouteTable

    @property
    def cookies(self) -> dict[str, str]:
        return {"memest_session": "1"} if self.logged_in else {}

    @property
    def scope(self) -> dict[str, Any]:
        return {"root_path": self.root_path}

    @property
    def app(self) -> Router:
        return _router(self.routes)


def render(view: PageView, name: str, **context: Any) -> bytes:
    """Template ``name`` rendered as Starlette's TemplateResponse does, as UTF-8 bytes."""
    return templates.get_template(name).render({**context, "request": view}).encode("utf-8")


_parsed: EntryCache[RunReport] = EntryCache(WORKER_REPORTS)


def parsed(stored: StoredReport) -> RunReport:
    """A stored report, parsed once per worker."""
    key = (stored.report_id, stored.payload_sha256)
    hit = _parsed.get(key)
    if hit is None:
        hit = RunReport.model_validate_json(stored.payload)
        _parsed.put(key, hit)
    return hit


# --- the model page ------------------------------------------------------------------------


def model_page_html(
    view: PageView, model: str, runs: list[RunRow], chosen: RunRow, stored: list[StoredReport]
) -> bytes:
    """A run's page: its lead report's stage bars, tables and whole-GPU bar, all ranks checked."""
    all_ranks = [parsed(s) for s in stored]
    rep = all_ranks[0]
    accounting = account(rep)
    facts = run_facts(rep)
    bd = rep.breakdown
    bars = stage_bars(rep, max_owners=PAGE_OWNERS_PER_STAGE, max_stages=PAGE_STAGES)
    runners = runner_counts(rep)
    peaks = [r for r in bd.live_peaks if r.peak_bytes >= SHOWN_MIN_BYTES] if bd else []
    retained = [r for r in bd.retained if r.bytes >= SHOWN_MIN_BYTES] if bd else []
    return render(
        view,
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


# --- the compare page ----------------------------------------------------------------------


def compare_page_html(
    view: PageView, a: str, b: str, stored_a: StoredReport, stored_b: StoredReport
) -> bytes:
    """Two runs' lead reports side by side (runs ``a`` and ``b`` as the request named them)."""
    ra, rb = parsed(stored_a), parsed(stored_b)
    cmp = compare(ra, rb)
    shown, more = capped_rows(cmp)
    return render(
        view,
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


def capped_rows(cmp: Comparison) -> tuple[dict[str, list[Delta]], dict[str, int]]:
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


# --- the history page ----------------------------------------------------------------------


#: Histories a page worker keeps (by model and stored state), so the pages of one history
#: read its JSON once per worker.
WORKER_HISTORIES = 8
_histories: EntryCache[History] = EntryCache(WORKER_HISTORIES)
_entry_list = TypeAdapter(list[HistoryEntry])


class HistoryBuild(NamedTuple):
    """A history page's HTML (None: the history has fewer pages), its number of pages, and
    what the server keeps for the next page, as JSON (bytes cross the pipe and are kept without
    work in the server; a History of 3,000 runs takes 150 ms to unpickle, 15 ms from JSON): the
    entries of the reports parsed for it, by report id, and the whole history (None when the
    server sent it)."""

    html: bytes | None
    pages: int
    entries: dict[str, bytes]
    history: bytes | None


def history_page_html(
    view: PageView,
    model: str,
    page: int,
    history_key: tuple[Any, ...],
    history_json: bytes | None,
    known: list[bytes],
    missing: list[StoredReport],
) -> HistoryBuild:
    """Page ``page`` of a model's history: the one under ``history_key`` when this worker or
    the server (``history_json``) has it, else the history of the ``known`` entries (JSON) and
    those of the ``missing`` reports (parsed here, not kept: a history of thousands of runs
    would fill the worker's reports with ones no page shows)."""
    new = {s.report_id: history_entry(RunReport.model_validate_json(s.payload)) for s in missing}
    hist = _histories.get(history_key)
    if hist is None and history_json is not None:
        hist = History.model_validate_json(history_json)
    built = None
    if hist is None:
        entries = _entry_list.validate_json(b"[" + b",".join(known) + b"]")
        hist = history_of(model, [*entries, *new.values()])
        built = hist.model_dump_json().encode()
    _histories.put(history_key, hist)
    kept = {report_id: e.model_dump_json().encode() for report_id, e in new.items()}
    pages = history_pages(hist)
    if page > pages:
        return HistoryBuild(None, pages, kept, built)
    window = history_window(hist, page)
    html = render(
        view,
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
    return HistoryBuild(html, pages, kept, built)

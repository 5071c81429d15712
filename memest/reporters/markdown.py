"""A run or a comparison as markdown tables (the same figures the dashboard shows).

Tables are built once as :class:`Table` (title, header, rows) so that markdown and HTML render the
same cells; ``memest report`` writes both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memest.analysis.stages import stage_bars
from memest.estimate import account
from memest.reporters.views import Comparison, Delta, run_facts, runner_counts
from memest.schema import RunReport
from memest.units import count_cell, gib_cell, ratio_cell


@dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


def _g(v: int | None, digits: int = 3) -> str:
    return gib_cell(v, digits)


def _sg(v: int | None) -> str:
    return gib_cell(v, signed=True)


_n = count_cell
_r = ratio_cell


def run_tables(report: RunReport) -> list[Table]:
    """Facts, phase split, stage x owner, graph counts and estimates of one report."""
    f = run_facts(report)
    summary = [
        ["Graph-pool growth, GiB", _g(f.graph_pool_bytes)],
        ["Added during capture, GiB", _g(f.total_added_bytes)],
        ["KV capacity, tokens", _n(f.kv_tokens)],
        ["KV cache, GiB", _g(f.kv_cache_bytes)],
        ["Non-KV memory, GiB", _g(f.non_kv_bytes)],
        ["Requests at max_model_len", _r(f.max_concurrency)],
        ["vLLM CUDA-graph estimate, GiB", _g(f.cudagraph_estimate_bytes, 2)],
        ["Usage minus budget (this start), GiB", _sg(f.usage_minus_budget_bytes)],
        ["Usage minus budget (vLLM), GiB", _sg(f.estimator_error_bytes)],
        ["Usage minus budget (memest), GiB", _sg(f.memest_error_bytes)],
    ]
    if f.definition == "stored":
        summary.append(["Definition", f.definition_note])
    out = [Table("Summary", ["Figure", "Value"], summary)]
    bd = report.breakdown
    if bd is not None and bd.phases:
        out.append(
            Table(
                "Actual added GPU memory (GiB/GPU)",
                ["Phase", "Total", "CUDA graph pools", "Other PyTorch", "Outside PyTorch"],
                [
                    [
                        p.phase,
                        _g(p.total_added_bytes),
                        _g(p.graph_pool_bytes),
                        _g(p.other_torch_bytes),
                        _g(p.outside_torch_bytes),
                    ]
                    for p in bd.phases
                ],
            )
        )
    bars = stage_bars(report)
    if bars:
        rows: list[list[str]] = []
        for bar in bars:
            rows.append([f"**{bar.stage}**", bar.widest or "", f"**{_g(bar.pool_growth_bytes)}**"])
            rows.extend(["", seg.owner, _g(seg.bytes)] for seg in bar.owners)
        out.append(Table("Pool growth per stage and owner (GiB)", ["Stage", "Owner", "GiB"], rows))
    runners = runner_counts(report)
    if runners:
        counted = [r.graph_count for r in runners if r.graph_count is not None]
        out.append(
            Table(
                f"Graphs per runner ({runners[0].source})",
                ["Runner", "Mode", "Graphs", "Widest"],
                [[r.label, r.graph_mode or "", _n(r.graph_count), r.widest or ""] for r in runners]
                + [["**Total**", "", f"**{sum(counted)}**", ""]],
            )
        )
    estimators = account(report).estimators
    if estimators:
        out.append(
            Table(
                "Estimates",
                ["Estimator", "CUDA-graph estimate, GiB", "KV tokens", "Usage − budget, GiB"],
                [
                    [
                        r.estimator,
                        _g(r.cudagraph_estimate_bytes, 2),
                        _n(r.kv_tokens),
                        _sg(r.usage_minus_budget_bytes),
                    ]
                    for r in estimators
                ],
            )
        )
    return out


def _rows(deltas: Sequence[Delta], *, counts: bool, widest: bool) -> list[list[str]]:
    fmt = _n if counts else _g
    rows = []
    for d in deltas:
        delta = "–" if d.delta is None else (f"{d.delta:+d}" if counts else _sg(d.delta))
        row = [d.label]
        if widest:
            row.append(f"{d.a_text or '–'} → {d.b_text or '–'}" if d.a_text or d.b_text else "")
        row += [fmt(d.a), fmt(d.b), delta, _r(d.ratio)]
        rows.append(row)
    return rows


def comparison_tables(cmp: Comparison) -> list[Table]:
    """The seed's "main → PR" tables for two runs."""
    a, b = cmp.a.build or "A", cmp.b.build or "B"
    head = [a, b, "Δ", "ratio"]
    out = [
        Table(
            "Actual added GPU memory (GiB/GPU)",
            ["", *head],
            _rows(cmp.phases, counts=False, widest=False),
        ),
        Table(
            "Capture stages: added pool memory (GiB)",
            ["Stage", f"Widest, {a} → {b}", *head],
            _rows(cmp.stages, counts=False, widest=True),
        ),
        Table(
            "Graph count per stage",
            ["Stage", *head],
            _rows(cmp.stage_graph_counts, counts=True, widest=False),
        ),
    ]
    if cmp.runners:
        out.append(
            Table(
                "Graphs per runner (capture plans)",
                ["Runner", f"Widest, {a} → {b}", *head],
                _rows(cmp.runners, counts=True, widest=True),
            )
        )
    if cmp.owners:
        out.append(
            Table(
                "Pool growth per stage and owner (GiB)",
                ["Stage · owner", *head],
                _rows(cmp.owners, counts=False, widest=False),
            )
        )
    est_rows = []
    for d in cmp.estimate:
        if d.key == "kv_tokens":
            est_rows.append([d.label, _n(d.a), _n(d.b), _r(d.ratio)])
        elif d.key.startswith("usage"):
            est_rows.append([d.label + ", GiB", _sg(d.a), _sg(d.b), ""])
        else:
            est_rows.append([d.label + ", GiB", _g(d.a, 2), _g(d.b, 2), _r(d.ratio)])
    est_rows.append([f"KV capacity relative to {a}", "1.00×", _r(cmp.kv_ratio), ""])
    out.append(Table("Budget and resulting KV capacity", ["", a, b, "ratio"], est_rows))
    return out


def render_tables(tables: Sequence[Table]) -> str:
    """Markdown for a list of tables (pipes in cells escaped)."""
    parts: list[str] = []
    for t in tables:
        parts.append(f"### {t.title}\n")
        parts.append("| " + " | ".join(c.replace("|", "\\|") for c in t.header) + " |")
        parts.append("|" + "|".join("---" for _ in t.header) + "|")
        for row in t.rows:
            parts.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        parts.append("")
    return "\n".join(parts)


def run_markdown(report: RunReport, images: Sequence[str] = ()) -> str:
    """A run report in markdown: header, optional image links, then the tables."""
    head = [
        f"## {report.model} · {report.build.label or report.run_id}",
        "",
        f"Run `{report.run_id}`, rank {report.rank} of {report.world_size}, "
        f"source **{report.source}**"
        + (f", commit `{report.build.vllm_commit}`" if report.build.vllm_commit else "")
        + (f", {report.gpu.name}" if report.gpu else "")
        + ".",
        "",
    ]
    head += [f"![{img}]({img})\n" for img in images]
    return "\n".join(head) + "\n" + render_tables(run_tables(report))


def comparison_markdown(cmp: Comparison, images: Sequence[str] = ()) -> str:
    """A comparison in markdown, in the seed's "main → PR" layout."""
    title = cmp.a.model if cmp.a.model == cmp.b.model else f"{cmp.a.model} vs {cmp.b.model}"
    head = [
        f"## {title}: {cmp.a.build} → {cmp.b.build}",
        "",
        f"A: `{cmp.a.run_id}` ({cmp.a.source}), B: `{cmp.b.run_id}` ({cmp.b.source}).",
        "",
    ]
    head += [f"![{img}]({img})\n" for img in images]
    return "\n".join(head) + "\n" + render_tables(comparison_tables(cmp))

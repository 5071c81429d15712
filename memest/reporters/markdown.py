"""A run or a comparison as markdown tables (the same figures the dashboard shows).

Tables are built once as :class:`~memest.reporters.table.Table` so that markdown and HTML render
the same cells; ``memest report`` writes both.
"""

from __future__ import annotations

from collections.abc import Sequence

from memest.analysis.stages import stage_bars
from memest.builds.compare import Comparison, Delta
from memest.builds.runs import build_label, config_summary, fingerprint, run_facts, runner_counts
from memest.estimate import account
from memest.reporters.owners import owner_label
from memest.reporters.table import Table, to_markdown
from memest.reporters.views import (
    NEGATIVE_NOTE,
    NESTED_NOTE,
    PhaseRow,
    definition_line,
    model_name,
    phase_rows,
)
from memest.schema import RunReport
from memest.units import count_cell, gib_cell, ratio_cell


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
        ["vLLM CUDA-graph estimate, GiB", _g(f.cudagraph_estimate_bytes)],
        ["Usage minus budget (this start), GiB", _sg(f.usage_minus_budget_bytes)],
        ["Usage minus budget (vLLM), GiB", _sg(f.estimator_error_bytes)],
        ["Usage minus budget (memest), GiB", _sg(f.memest_error_bytes)],
    ]
    if f.definition == "stored":
        summary.append(["Definition", definition_line(report, account(report))])
    out = [Table("Summary", ["Figure", "Value"], summary)]
    bd = report.breakdown
    if bd is not None and bd.phases:
        out.append(phase_table(phase_rows(bd.phases, report.phases)))
    bars = stage_bars(report)
    if bars:
        rows: list[list[str]] = []
        for bar in bars:
            rows.append([f"**{bar.stage}**", bar.widest or "", f"**{_g(bar.pool_growth_bytes)}**"])
            rows.extend(["", owner_label(seg.owner), _g(seg.bytes)] for seg in bar.owners)
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
                        _g(r.cudagraph_estimate_bytes),
                        _n(r.kv_tokens),
                        _sg(r.usage_minus_budget_bytes),
                    ]
                    for r in estimators
                ],
            )
        )
    return out


def _neg(v: int, marks: list[bool]) -> str:
    if v < 0:
        marks.append(True)
        return _g(v) + " †"
    return _g(v)


def phase_table(rows: Sequence[PhaseRow]) -> Table:
    """Added memory per phase, nested phases indented under the phase they run in; a negative
    category carries a mark and the footnote that says why."""
    marks: list[bool] = []
    body = []
    for r in rows:
        p = r.split
        name = p.phase if not r.depth else " " * r.depth + f"↳ {p.phase} (in {r.parent})"
        cells = [p.total_added_bytes, p.graph_pool_bytes, p.other_torch_bytes]
        body.append([name, *(_neg(v, marks) for v in [*cells, p.outside_torch_bytes])])
    notes = []
    if any(r.depth for r in rows):
        notes.append(f"{NESTED_NOTE}.")
    if marks:
        notes.append(f"† {NEGATIVE_NOTE}.")
    return Table(
        "Actual added GPU memory per phase (GiB/GPU)",
        ["Phase", "Total", "CUDA graph pools", "Other PyTorch", "Outside PyTorch"],
        body,
        notes,
    )


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
    a, b = cmp.a_name, cmp.b_name
    head = [a, b, "Δ", "ratio"]
    out = [
        _compared(cmp),
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
            est_rows.append([d.label + ", GiB", _g(d.a), _g(d.b), _r(d.ratio)])
    est_rows.append([f"KV capacity relative to {a}", "1.00×", _r(cmp.kv_ratio), ""])
    out.append(Table("Budget and resulting KV capacity", ["", a, b, "ratio"], est_rows))
    return out


def run_title(report: RunReport) -> str:
    """A run named by what it is: model, build and configuration."""
    return f"{model_name(report.model)} · {build_label(report)} · {config_summary(report.config)}"


def run_markdown(report: RunReport, images: Sequence[str] = ()) -> str:
    """A run report in markdown: header, optional image links, then the tables."""
    head = [
        f"## {run_title(report)}",
        "",
        f"Run `{report.run_id}`, rank {report.rank} of {report.world_size}, "
        f"source **{report.source}**"
        + (f", commit `{report.build.vllm_commit}`" if report.build.vllm_commit else "")
        + (f", {report.gpu.name}" if report.gpu else "")
        + f", configuration fingerprint `{fingerprint(report)}`.",
        "",
    ]
    head += [f"![{img}]({img})\n" for img in images]
    return "\n".join(head) + "\n" + to_markdown(run_tables(report))


def comparison_title(cmp: Comparison) -> str:
    """What a comparison compares: the model(s), A → B, and the first differences."""
    ma, mb = cmp.a.model_name or cmp.a.model, cmp.b.model_name or cmp.b.model
    title = ma if ma == mb else f"{ma} vs {mb}"
    text = f"{title}: {cmp.a_name} → {cmp.b_name}"
    if cmp.a_name == "A":
        changed = "; ".join(f"{c.field} {c.a} → {c.b}" for c in cmp.changes[:2])
        text += f" ({changed or 'same build, configuration and KV sizing'})"
    return text


def _compared(cmp: Comparison) -> Table:
    """Which runs, builds, commits and configurations are compared."""
    a, b = cmp.a, cmp.b
    rows = [
        ["Run", f"`{a.run_id}`", f"`{b.run_id}`"],
        ["Build", a.build, b.build],
        ["Commit", a.commit or "not recorded", b.commit or "not recorded"],
        ["KV cache sized by", a.kv_sized_by or "not recorded", b.kv_sized_by or "not recorded"],
        ["Configuration", a.config_summary, b.config_summary],
        ["Fingerprint", f"`{a.config_fingerprint}`", f"`{b.config_fingerprint}`"],
        ["Source", a.source, b.source],
    ]
    notes = [
        "Differences: "
        + (
            "; ".join(f"{c.field} {c.a} → {c.b}" for c in cmp.changes)
            or "none (same build, configuration and KV sizing: run-to-run variation)"
        )
        + "."
    ]
    return Table("What is compared", ["", cmp.a_name, cmp.b_name], rows, notes)


def comparison_markdown(cmp: Comparison, images: Sequence[str] = ()) -> str:
    """A comparison in markdown, in the seed's "main → PR" layout."""
    head = [f"## {comparison_title(cmp)}", ""]
    head += [f"![{img}]({img})\n" for img in images]
    return "\n".join(head) + "\n" + to_markdown(comparison_tables(cmp))

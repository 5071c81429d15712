"""Self-contained HTML for a run or a comparison: inline CSS and SVG, no scripts, no network."""

from __future__ import annotations

from html import escape

from memest.analysis.stages import stage_bars
from memest.builds.compare import Comparison
from memest.reporters import plots
from memest.reporters.markdown import (
    comparison_tables,
    comparison_title,
    run_tables,
    run_title,
)
from memest.reporters.table import to_html
from memest.schema import RunReport

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;color:#1f2933;margin:1.5rem;max-width:1100px}
h1{font-size:1.3rem}h2{font-size:1.05rem;margin-top:1.4rem}
table{border-collapse:collapse;margin:.3rem 0}
th,td{border-bottom:1px solid #d9e2ec;padding:.25rem .6rem;text-align:left}
th{background:#f5f7fa}td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}
.meta{color:#616e7c}
"""


def _page(title: str, meta: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1>"
        f'<p class="meta">{escape(meta)}</p>{body}</body></html>\n'
    )


def run_html(report: RunReport) -> str:
    """One report: stacked stage x owner bars and the run tables."""
    svg = plots.stage_owner_svg(stage_bars(report), "Graph-pool growth by capture stage and owner")
    meta = f"Run {report.run_id}, rank {report.rank}/{report.world_size}, source {report.source}"
    return _page(
        run_title(report),
        meta,
        svg + to_html(run_tables(report)),
    )


def comparison_html(cmp: Comparison) -> str:
    """Two runs: paired stage bars and the "main → PR" tables."""
    meta = f"A {cmp.a.run_id} ({cmp.a.source}) · B {cmp.b.run_id} ({cmp.b.source})"
    return _page(
        comparison_title(cmp),
        meta,
        plots.compare_svg(cmp) + to_html(comparison_tables(cmp)),
    )

"""Render a run, or a comparison of two runs, to markdown + SVG (and PNG, HTML).

  memest report report.rank0.json                      one run: tables + stage x owner bars
  memest report main.rank0.json pr.rank0.json          comparison A → B (the seed's main → PR)
  memest report main.json pr.json --png --html --out reports/cmp

Outputs are named memest-report-<input>.{md,svg,png,html} (memest-compare-<a>-vs-<b>.* for two
runs) in --out (default memest-out/) and are never overwritten without --force.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memest._version import install_hint
from memest.analysis.stages import stage_bars
from memest.cli._reports import load_report
from memest.errors import CommandError
from memest.reporters import html, plots
from memest.reporters.markdown import (
    comparison_markdown,
    comparison_title,
    run_markdown,
    run_title,
)
from memest.reporters.views import compare


class ReportCommand:
    name = "report"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("reports", nargs="+", metavar="REPORT", help="RunReport JSON (1 or 2)")
        parser.add_argument("--out", type=Path, default=Path("memest-out"), help="output folder")
        parser.add_argument("--png", action="store_true", help="also write a PNG (matplotlib)")
        parser.add_argument("--html", action="store_true", help="also write a standalone HTML")
        parser.add_argument("--force", action="store_true", help="overwrite existing outputs")
        parser.add_argument("--stdout", action="store_true", help="print the markdown as well")

    def run(self, args: argparse.Namespace) -> int:
        paths: list[Path] = [Path(p) for p in args.reports]
        if len(paths) > 2:
            raise CommandError("give one report (a run) or two (a comparison A → B)")
        reports = [load_report(p) for p in paths]
        if len(reports) == 1:
            stem = f"memest-report-{_stem(paths[0])}"
        else:
            stem = f"memest-compare-{_stem(paths[0])}-vs-{_stem(paths[1])}"
        out: Path = args.out
        targets = {"md": out / f"{stem}.md", "svg": out / f"{stem}.svg"}
        if args.png:
            targets["png"] = out / f"{stem}.png"
        if args.html:
            targets["html"] = out / f"{stem}.html"
        existing = [str(p) for p in targets.values() if p.exists()]
        if existing and not args.force:
            raise CommandError(f"{existing[0]} exists (use --force to overwrite)")
        out.mkdir(parents=True, exist_ok=True)
        images = [targets["svg"].name] + ([targets["png"].name] if args.png else [])
        if len(reports) == 1:
            rep = reports[0]
            bars = stage_bars(rep)
            title = run_title(rep)
            targets["svg"].write_text(plots.stage_owner_svg(bars, title))
            text = run_markdown(rep, images[:1])
            if args.png:
                _png(lambda p: plots.save_png_stage_owner(bars, p, title), targets["png"])
            if args.html:
                targets["html"].write_text(html.run_html(rep))
        else:
            cmp = compare(reports[0], reports[1])
            title = comparison_title(cmp)
            targets["svg"].write_text(plots.compare_svg(cmp))
            text = comparison_markdown(cmp, images[:1])
            if args.png:
                _png(lambda p: plots.save_png_compare(cmp, p, title), targets["png"])
            if args.html:
                targets["html"].write_text(html.comparison_html(cmp))
        targets["md"].write_text(text)
        if args.stdout:
            print(text)
        for path in targets.values():
            print(path)
        return 0


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".json", ".rank0", ".report"):
        name = name.removesuffix(suffix)
    return name or "report"


def _png(draw: object, path: Path) -> None:
    try:
        draw(path)  # type: ignore[operator]
    except ImportError as exc:
        raise CommandError(f"--png needs matplotlib ({install_hint('plots')}): {exc}") from None


COMMAND = ReportCommand()

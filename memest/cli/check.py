"""Gate a run on memory limits, for CI: exit 1 when any limit is breached.

  memest check report.rank0.json --max-graph-pool 6GiB --max-estimate-error 0.25GiB
  memest check pr.json --baseline main.json --max-kv-drop 0.05 --max-pool-growth 0.10
  memest check pr.json --baseline main.json --markdown memory.md   # a PR comment, one row a figure
  memest check pr.json --max-stage target.full=4GiB --min-kv-tokens 6000000

Every figure comes from the start's accounting (memest.estimate.account), as in `memest
estimate`, the service and the dashboard. Estimator error is |usage minus budget| of one
estimator's record (--estimator; "auto" takes the estimator that sized this start's KV cache, as
the report says: vLLM's budget in an enable or lite start, memest's in an apply start; else the
measured record, else vLLM's). --baseline compares KV tokens, non-KV memory and graph pool with
a start of the same model and mode (less KV or more of the others is worse; past its threshold,
default 1% for KV and 5% for the others, a regression) and --markdown writes that diff with the
command that reproduces each row. A limit the report has no figure for is an error (exit 2), never a silent pass. Exit codes: 0 every limit holds, 1 a limit is breached, 2 bad input.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from memest.analysis.ranks import capture_stages
from memest.builds.runs import estimator_error, kv_sized_by, run_facts
from memest.cli._reports import load_report
from memest.cli.check_diff import (
    DEFAULT_GROWTH,
    DEFAULT_KV_DROP,
    check_comparable,
    diff_rows,
    markdown,
)
from memest.errors import CommandError
from memest.schema import RunReport
from memest.units import fmt_bytes, parse_bytes


@dataclass(frozen=True)
class Outcome:
    name: str
    ok: bool
    detail: str


def _stage_limit(text: str) -> tuple[str, int]:
    stage, sep, size = text.partition("=")
    if not sep or not stage:
        raise argparse.ArgumentTypeError(
            f"expected STAGE=SIZE (e.g. target.full=4GiB), got {text!r}"
        )
    return stage, parse_bytes(size, field="--max-stage")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction such as 0.05, got {text!r}"
        ) from None
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"fraction out of range: {text}")
    return value


class CheckCommand:
    name = "check"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("report", type=Path, help="RunReport JSON to check")
        parser.add_argument("--max-graph-pool", metavar="SIZE", help="limit on graph-pool growth")
        parser.add_argument(
            "--max-total-added", metavar="SIZE", help="limit on memory added during capture"
        )
        parser.add_argument(
            "--max-estimate-error", metavar="SIZE", help="limit on |usage minus budget|"
        )
        parser.add_argument(
            "--estimator",
            default="auto",
            choices=["auto", "memest", "vllm", "published", "memest-plan", "measured"],
            help="whose estimate --max-estimate-error checks (default auto: the estimator that "
            "sized this start's KV cache, else the measured record, else vllm)",
        )
        parser.add_argument(
            "--min-kv-tokens", type=_count, metavar="N", help="KV capacity floor (N >= 0)"
        )
        parser.add_argument(
            "--max-stage",
            type=_stage_limit,
            action="append",
            default=[],
            metavar="STAGE=SIZE",
            help="limit on one stage's pool growth (repeatable)",
        )
        parser.add_argument("--baseline", type=Path, help="baseline RunReport for relative limits")
        parser.add_argument(
            "--max-kv-drop", type=_fraction, metavar="FRACTION", help="vs --baseline, e.g. 0.05"
        )
        parser.add_argument(
            "--max-pool-growth", type=_fraction, metavar="FRACTION", help="vs --baseline, e.g. 0.10"
        )
        parser.add_argument(
            "--max-non-kv-growth",
            type=_fraction,
            metavar="FRACTION",
            help="vs --baseline, e.g. 0.02",
        )
        parser.add_argument(
            "--markdown",
            type=Path,
            metavar="FILE",
            help="with --baseline: write the diff as markdown (a PR comment) to FILE",
        )

    def run(self, args: argparse.Namespace) -> int:
        report = load_report(args.report)
        baseline = load_report(args.baseline) if args.baseline else None
        if args.markdown is not None and baseline is None:
            raise CommandError("--markdown needs --baseline")
        outcomes = evaluate(report, baseline, args)
        if not outcomes:
            raise CommandError("no limit given (see memest check --help)")
        for o in outcomes:
            print(f"{'PASS' if o.ok else 'FAIL'}  {o.name}: {o.detail}")
        failed = [o for o in outcomes if not o.ok]
        print(f"{len(outcomes) - len(failed)}/{len(outcomes)} limits hold for {report.run_id}")
        return 1 if failed else 0


def _need(value: int | None, what: str, report: RunReport) -> int:
    if value is None:
        raise CommandError(f"{report.run_id}: the report has no {what}")
    return value


def _auto_estimator(report: RunReport) -> str:
    """The estimator whose budget this start ran with (kv_sized_by), else the measured record,
    else vLLM's (a report that does not say who sized it ran vLLM's own budget), else memest's."""
    sized = kv_sized_by(report)
    for name in (sized, "measured", "vllm", "memest"):
        if name is not None and estimator_error(report, name) is not None:
            return name
    return sized or "measured"


def _estimator_label(report: RunReport, name: str) -> str:
    return f"{name}, sized this start" if name == kv_sized_by(report) else name


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def evaluate(
    report: RunReport, baseline: RunReport | None, args: argparse.Namespace
) -> list[Outcome]:
    """Every requested limit, evaluated against the report (and the baseline)."""
    facts = run_facts(report)
    out: list[Outcome] = []
    if args.max_graph_pool:
        limit = parse_bytes(args.max_graph_pool, field="--max-graph-pool")
        v = _need(facts.graph_pool_bytes, "graph-pool figure (breakdown)", report)
        out.append(Outcome("graph pool", v <= limit, f"{fmt_bytes(v)} (limit {fmt_bytes(limit)})"))
    if args.max_total_added:
        limit = parse_bytes(args.max_total_added, field="--max-total-added")
        v = _need(facts.total_added_bytes, "capture phase split", report)
        out.append(
            Outcome(
                "added during capture", v <= limit, f"{fmt_bytes(v)} (limit {fmt_bytes(limit)})"
            )
        )
    if args.max_estimate_error:
        limit = parse_bytes(args.max_estimate_error, field="--max-estimate-error")
        name = _auto_estimator(report) if args.estimator == "auto" else args.estimator
        err = estimator_error(report, name)
        v = _need(err, f"usage-minus-budget figure for estimator {name!r}", report)
        out.append(
            Outcome(
                f"estimate error ({_estimator_label(report, name)})",
                abs(v) <= limit,
                f"usage minus budget {fmt_bytes(v)} (limit ±{fmt_bytes(limit)})",
            )
        )
    if args.min_kv_tokens is not None:
        v = _need(facts.kv_tokens, "KV token count", report)
        out.append(
            Outcome("KV tokens", v >= args.min_kv_tokens, f"{v:,} (floor {args.min_kv_tokens:,})")
        )
    stages = {s.stage: s.pool_growth_bytes for s in capture_stages(report)}
    for stage, limit in args.max_stage:
        if stage not in stages:
            raise CommandError(
                f"{report.run_id}: no stage {stage!r} (stages: {', '.join(stages) or 'none'})"
            )
        v = stages[stage]
        out.append(
            Outcome(f"stage {stage}", v <= limit, f"{fmt_bytes(v)} (limit {fmt_bytes(limit)})")
        )
    relative = (args.max_kv_drop, args.max_pool_growth, args.max_non_kv_growth)
    if any(v is not None for v in relative) and baseline is None:
        raise CommandError(
            "--max-kv-drop, --max-pool-growth and --max-non-kv-growth need --baseline"
        )
    if baseline is not None:
        out += _against_baseline(report, baseline, args)
    return out


def _against_baseline(
    report: RunReport, baseline: RunReport, args: argparse.Namespace
) -> list[Outcome]:
    """One outcome per figure of the diff; writes --markdown when asked."""
    note = check_comparable(report, baseline)
    thresholds = {
        "kv_tokens": _or(args.max_kv_drop, DEFAULT_KV_DROP),
        "non_kv_bytes": _or(args.max_non_kv_growth, DEFAULT_GROWTH),
        "graph_pool_bytes": _or(args.max_pool_growth, DEFAULT_GROWTH),
    }
    command = ["memest", "check", str(args.report), "--baseline", str(args.baseline)]
    rows = diff_rows(report, baseline, thresholds, command)
    if args.markdown is not None:
        args.markdown.write_text(markdown(report, baseline, rows, note))
    out = []
    for r in rows:
        change = r.value - r.baseline
        pct = f"{change / r.baseline:+.1%}" if r.baseline else "new"
        detail = f"{pct} ({r.cell(r.baseline)} → {r.cell(r.value)}; {r.verdict}, limit {r.threshold:.1%})"
        out.append(Outcome(f"{r.label} vs baseline", r.verdict != "regression", detail))
    return out


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


COMMAND = CheckCommand()

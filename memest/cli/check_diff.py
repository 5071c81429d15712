"""`memest check --baseline`: a start against its baseline, figure by figure, as a markdown
table ready to post on a pull request, with the command that reproduces each row's verdict.

Every figure comes from the two starts' accounting (memest.estimate.account); what counts as a
regression (direction, threshold, run-to-run noise) is memest.reporters.regression's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from memest.errors import CommandError
from memest.estimate import account
from memest.identity import config_fingerprint
from memest.reporters.regression import PAGE_THRESHOLDS, RUN_TO_RUN_SPREAD, start_mode, verdict
from memest.schema import RunReport, StartAccounting
from memest.units import fmt_bytes

#: Default thresholds (fractions of the baseline's figure) when no flag names one: the pages'
#: (memest.reporters.regression.PAGE_THRESHOLDS, the history's policy), so a start `memest
#: check` passes is not red on the compare page.
DEFAULT_KV_DROP = PAGE_THRESHOLDS["kv_tokens"]
DEFAULT_GROWTH = PAGE_THRESHOLDS["non_kv_bytes"]

#: Figure -> (row label, the check flag that gates it).
FIGURES = {
    "kv_tokens": ("KV capacity, tokens", "--max-kv-drop"),
    "non_kv_bytes": ("Non-KV memory", "--max-non-kv-growth"),
    "graph_pool_bytes": ("Graph-pool growth", "--max-pool-growth"),
}
MARKS = {
    "regression": "🔴 regression",
    "worse": "🟠 worse",
    "noise": "⚪ same",
    "better": "🟢 better",
}


@dataclass(frozen=True)
class DiffRow:
    figure: str
    label: str
    baseline: int
    value: int
    threshold: float
    verdict: str
    repro: str

    def cell(self, value: int) -> str:
        return f"{value:,}" if self.figure == "kv_tokens" else fmt_bytes(value)


def check_comparable(report: RunReport, baseline: RunReport) -> str | None:
    """Refuses a baseline of another model or mode (one line); returns a note when only the
    configuration differs (a change may move a default), else None."""
    acc, base = account(report), account(baseline)
    if report.model != baseline.model:
        raise CommandError(
            f"baseline is another model: {baseline.model!r}, this start {report.model!r}"
        )
    if start_mode(acc) != start_mode(base):
        raise CommandError(
            f"baseline ran in mode {start_mode(base)!r}, this start in {start_mode(acc)!r} "
            "(who sized the KV cache differs: compare starts of one mode)"
        )
    mine, theirs = config_fingerprint(report.config), config_fingerprint(baseline.config)
    if mine != theirs:
        return f"configuration differs from the baseline's ({theirs} → {mine})"
    return None


def _figure(acc: StartAccounting, figure: str) -> int | None:
    value: int | None = getattr(acc, figure)
    return value


def diff_rows(
    report: RunReport, baseline: RunReport, thresholds: dict[str, float], command: list[str]
) -> list[DiffRow]:
    """One row per figure both starts have; ``command`` is the check's argv up to its limits."""
    acc, base = account(report), account(baseline)
    rows = []
    for figure, (label, flag) in FIGURES.items():
        before, after = _figure(base, figure), _figure(acc, figure)
        if before is None or after is None:
            continue
        limit = thresholds[figure]
        repro = shlex.join([*command, flag, f"{limit:g}"])
        rows.append(
            DiffRow(
                figure, label, before, after, limit, verdict(figure, before, after, limit), repro
            )
        )
    return rows


def markdown(report: RunReport, baseline: RunReport, rows: list[DiffRow], note: str | None) -> str:
    """The diff as a markdown comment: header, one row per figure, and what the marks mean."""
    acc = account(report)
    lines = [
        f"### memest: `{report.model}` ({start_mode(acc)} mode) against its baseline",
        "",
        f"This start `{report.run_id}` (build {report.build.label or 'unlabelled'}), baseline "
        f"`{baseline.run_id}` (build {baseline.build.label or 'unlabelled'}), configuration "
        f"`{config_fingerprint(report.config)}`." + (f" Note: {note}." if note else ""),
        "",
        "| Figure | Baseline | This start | Change | Threshold | Verdict | Reproduce |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        change = r.value - r.baseline
        pct = f" ({change / r.baseline:+.2%})" if r.baseline else ""
        sign = "+" if change > 0 else ""
        shown = f"{sign}{change:,}" if r.figure == "kv_tokens" else sign + fmt_bytes(change)
        lines.append(
            f"| {r.label} | {r.cell(r.baseline)} | {r.cell(r.value)} | {shown}{pct} "
            f"| {r.threshold:.1%} | {MARKS[r.verdict]} | `{r.repro}` |"
        )
    lines += [
        "",
        "Less KV or more non-KV memory or graph pool is worse; a regression is worse by more "
        "than the threshold (a fraction of the baseline's figure); a change within the run-to-run "
        f"spread of repeated starts ({RUN_TO_RUN_SPREAD} bytes, measured on H200) reads same.",
        "",
    ]
    return "\n".join(lines)

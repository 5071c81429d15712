"""Where a finished report goes: a file per rank, then the service (retries, backoff, spool).

Pushing never holds up startup beyond ``MEMEST_PUSH_TIMEOUT_S``: one deadline bounds every
attempt, wait and read of the push (a server trickling its answer is cut off at it; see
memest.delivery), after which the report is spooled to ``<output dir>/spool/``. The report counts
as stored only on the service's acknowledgement of its id; a report the service refuses for good
(a 4xx about the report) goes to ``<output dir>/rejected/`` with a reason file instead, so it never
blocks the spool. Once a later start reaches the service again, its rank 0 sends what earlier
starts spooled, within what is left of the same deadline (at most ``SPOOL_BATCH_FILES`` reports,
one attempt each of at most 5 s), removes what the service then holds and moves what it refused
to ``rejected/``; ``memest push --spool DIR`` does the same by hand. A lone surrogate in the
report (text that cannot be UTF-8) is written as U+FFFD in the file and the push.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from memest.delivery import (
    REPORTS_PATH,
    PushOptions,
    PushResult,
    push_files,
    push_one,
    reason_path,
    rejected_dir,
    report_json,
)
from memest.runid import check_run_id
from memest.schema import RunReport
from memest_instrumentation.vllm.env import Settings

SPOOL_BATCH_FILES = 32
"""Spooled reports one start sends at most; the rest wait for the next start."""
_SPOOL_ATTEMPT_TIMEOUT_S = 5.0
_FIRST_BACKOFF_S = 0.5

logger = logging.getLogger(__name__)


def report_path(settings: Settings, report: RunReport) -> Path:
    """``<output dir>/<run id>/report.rank<N>.json``; a run id that is not a safe folder name
    (memest.runid) raises, so nothing is ever written outside the output folder."""
    run_id = check_run_id(report.run_id, field="run_id")
    return Path(settings.output_dir) / run_id / f"report.rank{report.rank}.json"


def _file_name(report: RunReport) -> str:
    return f"{check_run_id(report.run_id, field='run_id')}.rank{report.rank}.json"


def _atomic_write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_report(settings: Settings, report: RunReport) -> Path:
    """Write ``MEMEST_OUTPUT_DIR/<run>/report.rank<N>.json`` atomically."""
    text = report_json(report, replace_faults=True, indent=2)
    return _atomic_write(report_path(settings, report), text)


def push(
    settings: Settings,
    report: RunReport,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, list[str]]:
    """POST the report to the service; spool it when it was not stored, set it aside when refused.

    Everything, rank 0's delivery of the spool included, ends within ``MEMEST_PUSH_TIMEOUT_S``.

    Returns:
        (pushed, problems): whether the service acknowledged it, and one line per failed attempt
        (plus where the report was kept).
    """
    if not settings.service_url:
        return False, []
    deadline = clock() + settings.push_timeout_s
    result = push_one(
        report_json(report, replace_faults=True).encode(),
        settings.service_url + REPORTS_PATH,
        settings.token or None,
        report_id=report.report_id,
        retries=settings.push_retries - 1,
        timeout_s=settings.push_timeout_s,
        backoff_s=_FIRST_BACKOFF_S,
        sleep=sleep,
        deadline=deadline,
        clock=clock,
    )
    problems = list(result.problems)
    if result.ok:
        if report.rank == 0:  # one rank delivers, so ranks do not race for a file
            _log_delivery(deliver_spool(settings, clock=clock, deadline=deadline))
        return True, problems
    if result.refused:
        problems.append(f"refused by the service; kept in {set_aside(settings, report, result)}")
    else:
        problems.append(f"spooled to {spool(settings, report)}")
    return False, problems


def spool_dir(settings: Settings) -> Path:
    return Path(settings.output_dir) / "spool"


def spool(settings: Settings, report: RunReport) -> Path:
    """Keep an unsent report for a later push."""
    path = spool_dir(settings) / _file_name(report)
    return _atomic_write(path, report_json(report, replace_faults=True))


def set_aside(settings: Settings, report: RunReport, result: PushResult) -> Path:
    """Keep a report the service refused for good in ``rejected/`` beside the spool, with a
    ``.reason.txt`` file, where no later start tries it again."""
    folder = rejected_dir(spool_dir(settings))
    path = _atomic_write(folder / _file_name(report), report_json(report, replace_faults=True))
    reason = f"not stored after {result.attempts} attempt(s): {result.message}\n"
    _atomic_write(reason_path(path), reason)
    return path


def deliver_spool(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.monotonic,
    deadline: float | None = None,
) -> list[str]:
    """Send reports earlier starts spooled, remove the delivered ones and set aside the refused
    ones; never raises, and starts nothing after ``deadline`` (a ``clock`` value; default
    ``MEMEST_PUSH_TIMEOUT_S`` from now) nor runs past it.

    Returns one line for the batch (sent / already stored / skipped / failed) and one per file
    that stays in the spool or was moved out of it.
    """
    try:
        folder = spool_dir(settings)
        if not settings.service_url or not folder.is_dir():
            return []
        files = sorted(p for p in folder.glob("*.json") if not p.is_dir())
        if not files:
            return []
        options = PushOptions(
            url=settings.service_url,
            token=settings.token or None,
            retries=0,
            timeout_s=min(settings.push_timeout_s, _SPOOL_ATTEMPT_TIMEOUT_S),
        )
        result = push_files(
            files,
            options,
            remove_delivered=True,
            rejected=rejected_dir(folder),
            max_files=SPOOL_BATCH_FILES,
            deadline=clock() + settings.push_timeout_s if deadline is None else deadline,
            clock=clock,
        )
        kept = [f.describe() for f in result.files if f.outcome in ("skipped", "failed")]
        return [f"spooled reports: {result.summary()}", *kept]
    except Exception as exc:  # fail open: a spool problem never reaches vLLM
        return [f"spooled reports not delivered: {type(exc).__name__}: {exc}"]


def _log_delivery(lines: list[str]) -> None:
    for line in lines:
        logger.info("memest %s", line)

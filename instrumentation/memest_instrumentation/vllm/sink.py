"""Where a finished report goes: a file per rank, then the service (retries, backoff, spool).

Pushing never blocks startup beyond ``MEMEST_PUSH_TIMEOUT_S``: attempts stop at that deadline and
the report is spooled to ``<output dir>/spool/``. Once a later start reaches the service again,
its rank 0 sends what earlier starts spooled (at most ``SPOOL_BATCH_FILES`` files, one attempt
each of at most 5 s, starting none after another ``MEMEST_PUSH_TIMEOUT_S``) and removes what the
service then holds; ``memest push --spool DIR`` does the same by hand.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from memest.delivery import PushOptions, push_files
from memest.schema import RunReport
from memest_instrumentation.vllm.env import Settings

REPORTS_PATH = "/api/v1/reports"
SPOOL_BATCH_FILES = 32
"""Spooled reports one start sends at most; the rest wait for the next start."""
_SPOOL_ATTEMPT_TIMEOUT_S = 5.0

logger = logging.getLogger(__name__)


def report_path(settings: Settings, report: RunReport) -> Path:
    return Path(settings.output_dir) / report.run_id / f"report.rank{report.rank}.json"


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
    return _atomic_write(report_path(settings, report), report.model_dump_json(indent=2))


def push(
    settings: Settings,
    report: RunReport,
    *,
    sleep: object = time.sleep,
    clock: object = time.monotonic,
) -> tuple[bool, list[str]]:
    """POST the report to the service; spool it when every attempt failed.

    Returns:
        (pushed, problems): whether the service accepted it, and one line per failed attempt
        (plus where it was spooled).
    """
    problems: list[str] = []
    if not settings.service_url:
        return False, problems
    body = report.model_dump_json().encode()
    url = settings.service_url + REPORTS_PATH
    headers = {"Content-Type": "application/json"}
    if settings.token:
        headers["Authorization"] = f"Bearer {settings.token}"
    deadline = clock() + settings.push_timeout_s  # type: ignore[operator]
    delay = 0.5
    for attempt in range(1, settings.push_retries + 1):
        left = deadline - clock()  # type: ignore[operator]
        if left <= 0:
            problems.append(f"attempt {attempt}: push deadline reached")
            break
        try:
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=max(min(left, 5.0), 0.1)) as resp:
                status = int(resp.status)
            if 200 <= status < 300:
                if report.rank == 0:  # one rank delivers, so ranks do not race for a file
                    _log_delivery(deliver_spool(settings, clock=clock))  # type: ignore[arg-type]
                return True, problems
            problems.append(f"attempt {attempt}: HTTP {status}")
        except urllib.error.HTTPError as exc:
            problems.append(f"attempt {attempt}: HTTP {exc.code}")
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                break  # the service refused this report; retrying will not change that
        except (OSError, ValueError) as exc:
            problems.append(f"attempt {attempt}: {type(exc).__name__}: {exc}")
        if attempt < settings.push_retries:
            wait = min(delay, max(deadline - clock() - 0.01, 0))  # type: ignore[operator]
            if wait > 0:
                sleep(wait)  # type: ignore[operator]
            delay *= 2
    spooled = spool(settings, report)
    problems.append(f"spooled to {spooled}")
    return False, problems


def spool_dir(settings: Settings) -> Path:
    return Path(settings.output_dir) / "spool"


def spool(settings: Settings, report: RunReport) -> Path:
    """Keep an unsent report for a later push."""
    path = spool_dir(settings) / f"{report.run_id}.rank{report.rank}.json"
    return _atomic_write(path, json.dumps(report.model_dump(mode="json")))


def deliver_spool(settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Send reports earlier starts spooled and remove the delivered ones; never raises.

    Returns one line for the batch (sent / already stored / skipped / failed) and one per file
    that stays in the spool.
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
            max_files=SPOOL_BATCH_FILES,
            deadline=clock() + settings.push_timeout_s,
            clock=clock,
        )
        kept = [f.describe() for f in result.files if f.outcome in ("skipped", "failed")]
        return [f"spooled reports: {result.summary()}", *kept]
    except Exception as exc:  # fail open: a spool problem never reaches vLLM
        return [f"spooled reports not delivered: {type(exc).__name__}: {exc}"]


def _log_delivery(lines: list[str]) -> None:
    for line in lines:
        logger.info("memest %s", line)

"""Where a finished report goes: a file per rank, then the service (retries, backoff, spool).

Pushing never blocks startup beyond ``MEMEST_PUSH_TIMEOUT_S``: attempts stop at that deadline and
the report is spooled to ``<output dir>/spool/`` for ``memest push`` to send later.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from memest.schema import RunReport
from memest_instrumentation.vllm.env import Settings

REPORTS_PATH = "/api/v1/reports"


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


def spool(settings: Settings, report: RunReport) -> Path:
    """Keep an unsent report for a later push."""
    path = Path(settings.output_dir) / "spool" / f"{report.run_id}.rank{report.rank}.json"
    return _atomic_write(path, json.dumps(report.model_dump(mode="json")))

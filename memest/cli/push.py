"""Upload RunReports to a memest service, with retries.

  memest push memest-out/run-1/report.rank0.json --url http://memest:8000
  memest push memest-out/spool/ --url http://memest:8000 --retries 8

The token comes from --token or MEMEST_WRITE_TOKEN; the URL from --url or MEMEST_SERVICE_URL.
Connection errors, 5xx, 408 and 429 are retried with exponential backoff; any other 4xx is final
(the service names the field at fault). Exit 0 when every report is stored (or already was).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memest.cli._reports import load_report, report_files
from memest.errors import CommandError

REPORTS_PATH = "/api/v1/reports"


@dataclass(frozen=True)
class PushResult:
    ok: bool
    status: int | None
    message: str
    attempts: int


def push_one(
    body: bytes,
    url: str,
    token: str | None,
    *,
    retries: int,
    timeout_s: float,
    backoff_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> PushResult:
    """POST one report body, retrying transient failures up to ``retries`` extra times."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    last = ""
    for attempt in range(1, retries + 2):
        try:
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                payload = json.loads(resp.read() or b"{}")
                return PushResult(True, int(resp.status), str(payload.get("status", "")), attempt)
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            last = f"HTTP {exc.code}: {detail}"
            if exc.code < 500 and exc.code not in (408, 429):
                return PushResult(False, exc.code, last, attempt)
        except (OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        if attempt <= retries:
            sleep(backoff_s * 2 ** (attempt - 1))
    return PushResult(False, None, last, retries + 1)


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc.reason)
    if isinstance(data, dict):
        field = data.get("field")
        detail = data.get("detail", "")
        return f"{detail} (field: {field})" if field else str(detail)
    return str(data)


class PushCommand:
    name = "push"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "reports", nargs="+", type=Path, metavar="REPORT", help="JSON files or folders"
        )
        parser.add_argument(
            "--url", default=os.environ.get("MEMEST_SERVICE_URL"), help="service base URL"
        )
        parser.add_argument(
            "--token", default=None, help="bearer token (default MEMEST_WRITE_TOKEN)"
        )
        parser.add_argument(
            "--retries", type=int, default=5, help="extra attempts on transient errors"
        )
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds per attempt")
        parser.add_argument("--backoff", type=float, default=0.5, help="first retry delay, seconds")

    def run(self, args: argparse.Namespace) -> int:
        if not args.url:
            raise CommandError("no service URL: pass --url or set MEMEST_SERVICE_URL")
        if args.retries < 0:
            raise CommandError("--retries must be >= 0")
        token = args.token or os.environ.get("MEMEST_WRITE_TOKEN")
        files = report_files(list(args.reports))
        if not files:
            raise CommandError("no report files found")
        url = args.url.rstrip("/") + REPORTS_PATH
        failed = 0
        for path in files:
            report = load_report(path)
            result = push_one(
                report.model_dump_json().encode(),
                url,
                token,
                retries=args.retries,
                timeout_s=args.timeout,
                backoff_s=args.backoff,
            )
            if result.ok:
                print(f"{path}: {result.message or 'stored'} ({report.report_id})")
            else:
                failed += 1
                print(f"{path}: not stored after {result.attempts} attempt(s): {result.message}")
        if failed:
            raise CommandError(f"{failed} of {len(files)} report(s) not stored", exit_code=1)
        return 0


COMMAND = PushCommand()

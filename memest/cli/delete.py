"""Delete runs (and all their reports) from a memest service.

  memest delete RUN_ID --url http://memest:8000
  memest delete run-a run-b --url http://memest:8000 --token $MEMEST_WRITE_TOKEN

The token comes from --token or MEMEST_WRITE_TOKEN; the URL from --url or MEMEST_SERVICE_URL.
A deleted run's ids may be stored again. Exit 0 when every run is deleted, 1 when one is not
(no such run, a refused token, an unreachable service).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from urllib.parse import quote

from memest.delivery import http_error_detail
from memest.errors import CommandError

RUNS_PATH = "/api/v1/runs/"


def delete_one(base_url: str, run_id: str, token: str | None, *, timeout_s: float) -> str:
    """DELETE one run; returns what the service says, or raises CommandError with why not."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = base_url.rstrip("/") + RUNS_PATH + quote(run_id, safe="")
    req = urllib.request.Request(url, headers=headers, method="DELETE")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            payload = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise CommandError(f"HTTP {exc.code}: {http_error_detail(exc)}", exit_code=1) from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CommandError(f"{type(exc).__name__}: {reason}", exit_code=1) from None
    reports = payload.get("report_ids", []) if isinstance(payload, dict) else []
    return f"deleted ({len(reports)} report(s))"


class DeleteCommand:
    name = "delete"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("runs", nargs="+", metavar="RUN_ID", help="run ids to delete")
        parser.add_argument(
            "--url", default=os.environ.get("MEMEST_SERVICE_URL"), help="service base URL"
        )
        parser.add_argument(
            "--token", default=None, help="bearer token (default MEMEST_WRITE_TOKEN)"
        )
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")

    def run(self, args: argparse.Namespace) -> int:
        if not args.url:
            raise CommandError("no service URL: pass --url or set MEMEST_SERVICE_URL")
        token = args.token or os.environ.get("MEMEST_WRITE_TOKEN")
        deleted = [_delete_and_say(args.url, run_id, token, args.timeout) for run_id in args.runs]
        if not all(deleted):
            missed = deleted.count(False)
            raise CommandError(f"{missed} of {len(args.runs)} run(s) not deleted", exit_code=1)
        return 0


def _delete_and_say(base_url: str, run_id: str, token: str | None, timeout_s: float) -> bool:
    """Delete one run and print one line saying what happened; True when it is gone."""
    try:
        print(f"{run_id}: {delete_one(base_url, run_id, token, timeout_s=timeout_s)}")
    except CommandError as exc:
        print(f"{run_id}: not deleted: {exc}")
        return False
    return True


COMMAND = DeleteCommand()

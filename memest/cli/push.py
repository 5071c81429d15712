"""Upload RunReports to a memest service, with retries.

  memest push memest-out/run-1/report.rank0.json --url http://memest:8000
  memest push memest-out/ --url http://memest:8000 --retries 8
  memest push --spool memest-out/spool --url http://memest:8000

The token comes from --token or MEMEST_WRITE_TOKEN; the URL from --url or MEMEST_SERVICE_URL.
Folders are searched for *.json files. A report counts as stored only when the service
acknowledges it by id (a 2xx page that is not memest's answer is a failure); redirects are not
followed, so the token goes to --url's host only. Connection errors, timeouts, 5xx, 408 and 429
are retried with exponential backoff; any other answer is final (the service names the field at
fault). --timeout bounds each attempt as a whole, however slowly the server answers. A file that
is not a valid report (or does not exist, or holds a lone surrogate, which cannot be sent as
UTF-8) is skipped and named; the others are still sent. --spool DIR sends the reports the vLLM
plugin spooled when the service was unreachable, removes each one the service then holds, and
moves each one it refused for good (a 4xx other than 401, 403, 404, 405, 407, 408, 429) to
rejected/ beside DIR with a .reason.txt file. A one-GPU report whose run id already holds another
start (a MEMEST_RUN_ID set once and reused by later launches) is stored under a fresh run id, its
own plus the report id's first 8 characters; pushing it again answers "already stored". Prints one line per file, then: sent, already
stored, skipped, failed. Exit 0 when nothing failed, 1 when a report was not stored or a named
file does not exist (the others are still sent), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from memest.delivery import (
    FileResult,
    PushOptions,
    check_service_url,
    push_files,
    rejected_dir,
    report_files,
)
from memest.delivery import push_one as push_one  # re-exported: the retry loop's home
from memest.errors import CommandError


def _print_result(result: FileResult) -> None:
    print(result.describe())


class PushCommand:
    name = "push"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "reports", nargs="*", type=Path, metavar="REPORT", help="JSON files or folders"
        )
        parser.add_argument(
            "--spool",
            type=Path,
            metavar="DIR",
            help="send the plugin's spooled reports in DIR and remove the delivered ones",
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
        parser.add_argument(
            "--timeout", type=float, default=10.0, help="seconds per attempt, all of it"
        )
        parser.add_argument("--backoff", type=float, default=0.5, help="first retry delay, seconds")

    def run(self, args: argparse.Namespace) -> int:
        if not args.url:
            raise CommandError("no service URL: pass --url or set MEMEST_SERVICE_URL")
        check_service_url(args.url)
        if args.retries < 0:
            raise CommandError("--retries must be >= 0")
        if not (math.isfinite(args.timeout) and math.isfinite(args.backoff)):
            raise CommandError("--timeout and --backoff must be finite numbers")
        if args.timeout <= 0 or args.backoff < 0:
            raise CommandError("--timeout must be > 0 and --backoff >= 0")
        files = self._files(args)
        options = PushOptions(
            url=args.url,
            token=args.token or os.environ.get("MEMEST_WRITE_TOKEN"),
            retries=args.retries,
            timeout_s=args.timeout,
            backoff_s=args.backoff,
        )
        spool = args.spool is not None
        result = push_files(
            files,
            options,
            remove_delivered=spool,
            rejected=rejected_dir(args.spool) if spool else None,
            on_result=_print_result,
        )
        print(result.summary())
        missing = any(not p.exists() and not p.is_symlink() for p in args.reports or ())
        return 1 if result.count("failed") or missing else 0

    def _files(self, args: argparse.Namespace) -> list[Path]:
        if args.spool is not None:
            if args.reports:
                raise CommandError("give REPORT files or --spool DIR, not both")
            if not args.spool.is_dir():
                raise CommandError(f"--spool {args.spool}: not a folder")
            return report_files([args.spool])
        if not args.reports:
            raise CommandError("give REPORT files or folders, or --spool DIR")
        files = report_files(list(args.reports))  # a missing file is tried, and named skipped
        if not files:
            raise CommandError("no report files found")
        return files


COMMAND = PushCommand()

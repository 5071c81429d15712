"""Sending RunReport files to a memest service: one POST with retries, or a whole folder.

Shared by ``memest push`` and the vLLM plugin (which delivers its spool on the next start), so a
file is classified the same way everywhere: sent, already stored, skipped (not a report) or
failed (the service refused it or could not be reached).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from memest.errors import MemestError
from memest.files import load_report

REPORTS_PATH = "/api/v1/reports"

Outcome = Literal["sent", "exists", "skipped", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("sent", "exists", "skipped", "failed")
OUTCOME_LABELS: dict[Outcome, str] = {
    "sent": "sent",
    "exists": "already stored",
    "skipped": "skipped",
    "failed": "failed",
}


@dataclass(frozen=True)
class PushResult:
    ok: bool
    status: int | None
    message: str
    attempts: int


@dataclass(frozen=True)
class FileResult:
    path: Path
    outcome: Outcome
    detail: str

    def describe(self) -> str:
        return f"{self.path}: {self.detail}"


@dataclass
class FolderResult:
    files: list[FileResult] = field(default_factory=list)
    left: int = 0
    """Files not tried because the count or time limit was reached."""

    def count(self, outcome: Outcome) -> int:
        return sum(1 for f in self.files if f.outcome == outcome)

    def summary(self) -> str:
        parts = [f"{self.count(o)} {OUTCOME_LABELS[o]}" for o in OUTCOMES]
        if self.left:
            parts.append(f"{self.left} left for later")
        return ", ".join(parts)


@dataclass(frozen=True)
class PushOptions:
    url: str
    """Service base URL (``/api/v1/reports`` is appended)."""
    token: str | None = None
    retries: int = 3
    timeout_s: float = 10.0
    backoff_s: float = 0.5
    sleep: Callable[[float], None] = time.sleep

    @property
    def reports_url(self) -> str:
        return self.url.rstrip("/") + REPORTS_PATH


def check_service_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host, else a one-line error naming it.

    Raises:
        MemestError: another scheme, no host, or an unparsable port.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as exc:
        raise MemestError(
            f"--url {url!r}: not a URL ({exc}); expected http(s)://HOST[:PORT]"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise MemestError(f"--url {url!r}: expected http(s)://HOST[:PORT] of a memest service")
    return url


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
    """POST one report body, retrying transient failures up to ``retries`` extra times.

    Connection errors, 5xx, 408 and 429 are retried with exponential backoff; any other 4xx is
    final (the service names the field at fault).
    """
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
            detail = http_error_detail(exc)
            last = f"HTTP {exc.code}: {detail}"
            if exc.code < 500 and exc.code not in (408, 429):
                return PushResult(False, exc.code, last, attempt)
        except ValueError as exc:  # a malformed URL: another attempt cannot help
            return PushResult(False, None, f"bad service URL {url!r}: {exc}", attempt)
        except OSError as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        if attempt <= retries:
            sleep(backoff_s * 2 ** (attempt - 1))
    return PushResult(False, None, last, retries + 1)


def http_error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc.reason)
    if isinstance(data, dict):
        where = data.get("field")
        detail = data.get("detail", "")
        return f"{detail} (field: {where})" if where else str(detail)
    return str(data)


def push_file(path: Path, options: PushOptions) -> FileResult:
    """Load one report file and POST it; a file that is not a valid report is skipped."""
    try:
        report = load_report(path)
    except MemestError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        return FileResult(path, "skipped", f"skipped, not a valid report: {reason}")
    result = push_one(
        report.model_dump_json().encode(),
        options.reports_url,
        options.token,
        retries=options.retries,
        timeout_s=options.timeout_s,
        backoff_s=options.backoff_s,
        sleep=options.sleep,
    )
    if not result.ok:
        return FileResult(
            path, "failed", f"not stored after {result.attempts} attempt(s): {result.message}"
        )
    status = result.message or "created"
    outcome: Outcome = "exists" if status == "exists" else "sent"
    return FileResult(path, outcome, f"{status} ({report.report_id})")


def push_files(
    paths: list[Path],
    options: PushOptions,
    *,
    remove_delivered: bool = False,
    max_files: int | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_result: Callable[[FileResult], None] | None = None,
) -> FolderResult:
    """Push each file in turn, going on past skipped and failed ones.

    ``remove_delivered`` deletes a file once the service holds it (sent or already stored);
    ``max_files`` and ``deadline`` (a ``clock`` value) leave the rest for a later delivery.
    """
    out = FolderResult()
    for i, path in enumerate(paths):
        if (max_files is not None and i >= max_files) or (
            deadline is not None and clock() >= deadline
        ):
            out.left = len(paths) - i
            break
        result = push_file(path, options)
        if remove_delivered and result.outcome in ("sent", "exists"):
            path.unlink(missing_ok=True)
        out.files.append(result)
        if on_result is not None:
            on_result(result)
    return out


def report_files(paths: list[Path]) -> list[Path]:
    """Expand folders into their ``*.json`` entries (sorted); files pass through.

    Devices, FIFOs and broken links named ``*.json`` are kept, so the push names them as skipped.
    """
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.json") if not q.is_dir()))
        else:
            out.append(p)
    return out

"""Sending RunReport files to a memest service: one POST with retries, or a whole folder.

Shared by ``memest push`` and the vLLM plugin (which delivers its spool on the next start), so a
file is classified the same way everywhere: sent, already stored, skipped (not a report) or
failed (the service refused it or could not be reached).

A report counts as stored only when the service answers its acknowledgement, the JSON object of
``POST /api/v1/reports`` (``{"status": "created" | "exists", "report_id": <this report's id>,
...}``): a 2xx page from a proxy or a login screen is a failure. Redirects are never followed
(a 3xx is a failure), so the bearer token only ever goes to the configured host. Each attempt
has one deadline for the whole exchange (connect, send, every read), not one per read: a server
that trickles its answer byte by byte is cut off at the deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from memest.errors import MemestError
from memest.files import load_report
from memest.schema import RunReport

REPORTS_PATH = "/api/v1/reports"
ACK_STATUSES = ("created", "exists")
"""The ``status`` values of the service's acknowledgement (memest.service.schemas.IngestResponse)."""
REJECTED_FOLDER = "rejected"
"""Beside a spool folder: the reports the service refused for good, each with a reason file."""
_RESPONSE_LIMIT = 64 * 1024
"""Bytes of an answer read at most: an acknowledgement is a few hundred."""
_CONFIG_STATUSES = frozenset({401, 403, 404, 405, 407})
"""4xx answers about the URL or the credentials, not the report: fixing the configuration makes
the same report storable, so such a report is kept for a later push, never set aside."""

Outcome = Literal["sent", "exists", "skipped", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("sent", "exists", "skipped", "failed")
OUTCOME_LABELS: dict[Outcome, str] = {
    "sent": "sent",
    "exists": "already stored",
    "skipped": "skipped",
    "failed": "failed",
}


@dataclass(frozen=True)
class FileResult:
    path: Path
    outcome: Outcome
    detail: str
    set_aside: bool = False
    """Refused for good and moved to ``rejected/`` (a failed file of a spool)."""

    def describe(self) -> str:
        return printable(f"{self.path}: {self.detail}")


@dataclass
class FolderResult:
    files: list[FileResult] = field(default_factory=list)
    left: int = 0
    """Files not tried because the count or time limit was reached."""

    def count(self, outcome: Outcome) -> int:
        return sum(1 for f in self.files if f.outcome == outcome)

    def summary(self) -> str:
        parts = [f"{self.count(o)} {OUTCOME_LABELS[o]}" for o in OUTCOMES]
        moved = sum(1 for f in self.files if f.set_aside)
        if moved:
            parts[-1] += f" ({moved} moved to {REJECTED_FOLDER}/)"
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


class _Answer(NamedTuple):
    status: int
    content_type: str
    body: bytes


class _Attempt(NamedTuple):
    kind: Literal["stored", "transient", "refused", "final"]
    """stored: acknowledged; transient: worth another attempt; refused: the service will never
    store this report; final: no use retrying now, but the report itself may be fine."""
    status: int | None
    message: str
    field: str | None = None
    """The field the service named in a refusal."""


@dataclass(frozen=True)
class PushResult:
    ok: bool
    status: int | None
    message: str
    """The acknowledgement's status (created or exists) when ok, else the last failure."""
    attempts: int
    refused: bool = False
    """The service refused this report for good (a 4xx about the report itself)."""
    problems: tuple[str, ...] = ()
    """One line per failed attempt (``attempt N: ...``)."""
    field: str | None = None
    """The field the service named when it refused the report."""


class ReportEncodingError(MemestError, ValueError):
    """A report holds text that cannot be sent as UTF-8 JSON (a lone surrogate)."""


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _first_lone_surrogate(value: Any, where: str = "") -> tuple[str, str] | None:
    """(field path, the surrogate) of the first string, or key, holding a lone surrogate."""
    if isinstance(value, str):
        found = _LONE_SURROGATE.search(value)
        return (where or "(report)", found.group()) if found else None
    items: list[tuple[object, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, item in items:
        path = f"{where}.{key}" if where else str(key)
        in_key = _first_lone_surrogate(key, path) if isinstance(key, str) else None
        hit = in_key or _first_lone_surrogate(item, path)
        if hit:
            return hit
    return None


def _replace_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_lone_surrogates(k): _replace_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_lone_surrogates(v) for v in value]
    return value


def report_json(
    report: RunReport, *, replace_faults: bool = False, indent: int | None = None
) -> str:
    """The report as JSON text that encodes to UTF-8.

    A lone surrogate (a file name decoded with surrogateescape, say) cannot be sent: the service
    refuses it. ``replace_faults`` writes U+FFFD in its place (the vLLM plugin: a start's report
    is kept, its odd characters replaced); otherwise it is an error naming the field.

    Raises:
        ReportEncodingError: a lone surrogate, and ``replace_faults`` is off.
    """
    data = report.model_dump(mode="json")
    hit = _first_lone_surrogate(data)
    if hit is not None:
        if not replace_faults:
            where, char = hit
            raise ReportEncodingError(
                f"field {where}: a lone surrogate {ascii(char)} cannot be encoded as UTF-8"
            )
        report = RunReport.model_validate(_replace_lone_surrogates(data))
    return report.model_dump_json(indent=indent)


def printable(text: object) -> str:
    """``text`` with anything a UTF-8 terminal cannot print (a lone surrogate in a file name)
    written as a backslash escape, so printing it never raises."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> _Answer:
    """One POST whose whole exchange ends within ``timeout_s`` seconds; redirects not followed.

    The socket timeout bounds each operation; a timer shuts the socket down at the deadline, so a
    blocked read or write ends there however slowly the server trickles bytes. (Resolving a host
    name is the one step the timer cannot cut short.)

    Raises:
        TimeoutError: the deadline passed.
        OSError, http.client.HTTPException: the connection failed or the answer is malformed.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected http(s)://HOST[:PORT]")
    https = parts.scheme == "https"
    connection_class = http.client.HTTPSConnection if https else http.client.HTTPConnection
    conn = connection_class(parts.hostname or "", parts.port, timeout=timeout_s)
    expired = threading.Event()

    def cut_off() -> None:
        expired.set()  # before reading conn.sock: a socket made after this is checked below
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(min(timeout_s, threading.TIMEOUT_MAX), cut_off)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if expired.is_set():
            raise TimeoutError
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("POST", target, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read(_RESPONSE_LIMIT)
        if expired.is_set():
            raise TimeoutError
        return _Answer(response.status, response.getheader("Content-Type") or "", data)
    except (OSError, http.client.HTTPException):
        if expired.is_set():
            raise TimeoutError(f"no complete answer within {timeout_s:.3g} s") from None
        raise
    finally:
        timer.cancel()
        conn.close()


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _classify(answer: _Answer, report_id: str | None) -> _Attempt:
    """What one answer means for the report (see _Attempt.kind)."""
    code = answer.status
    payload = _json_object(answer.body)
    if 200 <= code < 300:
        if (
            payload is not None
            and payload.get("status") in ACK_STATUSES
            and isinstance(payload.get("report_id"), str)
            and (report_id is None or payload["report_id"] == report_id)
        ):
            return _Attempt("stored", code, str(payload["status"]))
        kind = answer.content_type.split(";")[0].strip() or "no content type"
        return _Attempt(
            "final", code, f"HTTP {code} ({kind}) is not the memest service's acknowledgement"
        )
    if 300 <= code < 400:
        return _Attempt("final", code, f"HTTP {code}: a redirect, not followed (check the URL)")
    last = f"HTTP {code}: {_error_detail(payload, answer)}"
    if code >= 500 or code in (408, 429):
        return _Attempt("transient", code, last)
    where = payload.get("field") if payload is not None else None
    verdict: Literal["final", "refused"] = "final" if code in _CONFIG_STATUSES else "refused"
    return _Attempt(verdict, code, last, where if isinstance(where, str) else None)


def _error_detail(payload: dict[str, Any] | None, answer: _Answer) -> str:
    if payload is None:
        return http.client.responses.get(answer.status, "error")
    where = payload.get("field")
    detail = payload.get("detail", "")
    return printable(f"{detail} (field: {where})" if where else detail)


def _attempt(
    body: bytes, url: str, headers: dict[str, str], timeout_s: float, report_id: str | None
) -> _Attempt:
    try:
        return _classify(_post(url, body, headers, timeout_s), report_id)
    except TimeoutError as exc:
        return _Attempt("transient", None, f"TimeoutError: {exc}" if str(exc) else "TimeoutError")
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        return _Attempt("transient", None, printable(f"{type(exc).__name__}: {reason}"))
    except ValueError as exc:  # a malformed URL or header: another attempt cannot help
        return _Attempt("final", None, f"bad service URL {url!r}: {exc}")


def push_one(
    body: bytes,
    url: str,
    token: str | None,
    *,
    report_id: str | None,
    retries: int,
    timeout_s: float,
    backoff_s: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> PushResult:
    """POST one report body, retrying transient failures up to ``retries`` extra times.

    Connection errors, timeouts, 5xx, 408 and 429 are retried with exponential backoff. Any other
    answer is final: a 4xx about the report (the service names the field at fault) sets
    ``refused``; a 401/403/404/405/407, a redirect or a 2xx that is not the acknowledgement of
    ``report_id`` (None: any report id) leave it unset. Each attempt ends within ``timeout_s``
    and, with ``deadline`` (a ``clock`` value), every attempt and wait ends by the deadline.
    """
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    problems: list[str] = []
    status: int | None = None
    for attempt in range(1, retries + 2):
        left = timeout_s if deadline is None else min(timeout_s, deadline - clock())
        if left <= 0:
            problems.append(f"attempt {attempt}: push deadline reached")
            break
        outcome = _attempt(body, url, headers, left, report_id)
        if outcome.kind == "stored":
            return PushResult(
                True, outcome.status, outcome.message, attempt, False, tuple(problems)
            )
        status = outcome.status
        problems.append(f"attempt {attempt}: {outcome.message}")
        if outcome.kind != "transient":
            refused = outcome.kind == "refused"
            return PushResult(
                False, status, outcome.message, attempt, refused, tuple(problems), outcome.field
            )
        if attempt <= retries:
            wait = backoff_s * 2 ** (attempt - 1)
            if deadline is not None:
                wait = min(wait, deadline - clock())
            if wait > 0:
                sleep(wait)
    attempts = sum(1 for p in problems if not p.endswith("push deadline reached"))
    message = problems[-1].split(": ", 1)[1] if problems else "not tried"
    return PushResult(False, status, message, attempts, False, tuple(problems))


def http_error_detail(exc: urllib.error.HTTPError) -> str:
    """The service's ``detail`` (and ``field``) of an error answer urllib raised."""
    try:
        data = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return exc.reason if isinstance(exc.reason, str) else str(exc.reason)
    if isinstance(data, dict):
        where = data.get("field")
        detail = data.get("detail", "")
        return f"{detail} (field: {where})" if where else str(detail)
    return str(data)


def rejected_dir(spool: Path) -> Path:
    """``rejected/`` beside the spool folder (outside it, so a later push never finds it there)."""
    return spool.absolute().parent / REJECTED_FOLDER


def reason_path(rejected: Path) -> Path:
    """Where the reason a report in ``rejected/`` was refused is written."""
    return rejected.with_name(rejected.name + ".reason.txt")


def reject(path: Path, folder: Path, reason: str) -> Path:
    """Move a report the service refused for good out of its spool into ``folder``, with
    ``<name>.reason.txt`` saying why; returns where it went."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    os.replace(path, target)
    reason_path(target).write_text(reason + "\n", encoding="utf-8")
    return target


def push_file(
    path: Path,
    options: PushOptions,
    *,
    rejected: Path | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> FileResult:
    """Load one report file and POST it; a file that is not a valid report is skipped.

    With ``rejected`` (a folder), a report the service refused for good is moved there.
    """
    try:
        report = load_report(path)
        body = report_json(report).encode()
    except MemestError as exc:
        reason = printable(str(exc).removeprefix(f"{path}: "))
        return FileResult(path, "skipped", f"skipped, not a valid report: {reason}")
    result = _send(report, body, options, deadline, clock)
    renamed = None
    if not result.ok and _run_id_taken(result) and report.world_size == 1:
        renamed = report.model_copy(update={"run_id": fresh_run_id(report)})
        again = _send(renamed, report_json(renamed).encode(), options, deadline, clock)
        result = again if again.ok else result
    if not result.ok:
        detail = f"not stored after {result.attempts} attempt(s): {result.message}"
        if _run_id_taken(result) and result.field == "rank":
            detail += "; the run id repeats across launches: set MEMEST_RUN_ID once per launch"
        if rejected is not None and result.refused:
            try:
                moved = reject(path, rejected, detail)
            except OSError as exc:  # kept in the spool: tried again next time, never lost
                return FileResult(path, "failed", f"{detail}; not moved to {rejected}: {exc}")
            return FileResult(path, "failed", f"{detail}; moved to {moved}", set_aside=True)
        return FileResult(path, "failed", detail)
    status = result.message
    outcome: Outcome = "exists" if status == "exists" else "sent"
    if renamed is None:
        return FileResult(path, outcome, f"{status} ({report.report_id})")
    what = "already stored" if outcome == "exists" else "created"
    return FileResult(
        path,
        outcome,
        f"{what} as run {renamed.run_id} ({report.report_id}): run {report.run_id} holds "
        "another start",
    )


def _send(
    report: RunReport,
    body: bytes,
    options: PushOptions,
    deadline: float | None,
    clock: Callable[[], float],
) -> PushResult:
    return push_one(
        body,
        options.reports_url,
        options.token,
        report_id=report.report_id,
        retries=options.retries,
        timeout_s=options.timeout_s,
        backoff_s=options.backoff_s,
        sleep=options.sleep,
        deadline=deadline,
        clock=clock,
    )


def _run_id_taken(result: PushResult) -> bool:
    """A 409 because the run id (its rank) holds another start, or because this report was
    stored before under its fresh run id (its content then differs by the run id alone)."""
    return result.status == 409 and result.field in ("rank", "report_id")


_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def fresh_run_id(report: RunReport) -> str:
    """The run id a one-GPU report is stored under when its own names another start (a run id
    set once and reused by later launches): the run id with the report id's first 8 characters,
    the same on every push of the file, so a re-push is answered "already stored"."""
    suffix = _RUN_ID_UNSAFE.sub("-", report.report_id[:8])
    return f"{report.run_id[: 127 - len(suffix)]}.{suffix}"


def push_files(
    paths: list[Path],
    options: PushOptions,
    *,
    remove_delivered: bool = False,
    rejected: Path | None = None,
    max_files: int | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_result: Callable[[FileResult], None] | None = None,
) -> FolderResult:
    """Push each file in turn, going on past skipped and failed ones.

    For a spool: ``remove_delivered`` deletes a file once the service holds it (sent or already
    stored); ``rejected`` (a folder outside the spool, see rejected_dir) takes each file the
    service refused for good, with its reason, so refused files never block the spool. ``max_files`` (reports sent, skipped files not
    counted) and ``deadline`` (a ``clock`` value; no attempt runs past it) leave the rest for a
    later delivery.
    """
    out = FolderResult()
    tried = 0
    for i, path in enumerate(paths):
        if (max_files is not None and tried >= max_files) or (
            deadline is not None and clock() >= deadline
        ):
            out.left = len(paths) - i
            break
        result = push_file(path, options, rejected=rejected, deadline=deadline, clock=clock)
        tried += result.outcome != "skipped"
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

"""Local HTTP servers on 127.0.0.1 that misbehave the ways a push meets in the field.

Each is a context manager yielding its base URL and a `Log` of the requests it got. The
acknowledgement `ServiceDouble` sends is written here by hand from the service's contract
(memest.service.schemas.IngestResponse: status, report_id, run_id), not produced by memest.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict[str, object]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


@dataclass
class Log:
    requests: list[Request] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    """Statuses to answer, first to last; once empty, the handler's normal answer."""


class _Handler(BaseHTTPRequestHandler):
    log: Log

    def log_message(self, *args: object) -> None:
        pass

    def _record(self) -> Request:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = Request(self.path, dict(self.headers), body)
        self.log.requests.append(request)
        return request

    def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._record()
        self._send(200, b"<html>sign in</html>", "text/html")


class ServiceDouble(_Handler):
    """Answers like POST /api/v1/reports: 201 and the acknowledgement naming the report's id."""

    def do_POST(self) -> None:  # noqa: N802
        request = self._record()
        status = self.log.statuses.pop(0) if self.log.statuses else 201
        if status >= 300:
            self._send(status, b'{"detail": "refused", "field": "model"}', "application/json")
            return
        report = request.json
        ack = {"status": "created", "report_id": report["report_id"], "run_id": report["run_id"]}
        self._send(status, json.dumps(ack).encode(), "application/json")


class LoginPage(_Handler):
    """A proxy's single-sign-on page: 200 and HTML for any request."""

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        self._send(200, b"<html><form>sign in</form></html>", "text/html; charset=utf-8")


class OtherReportAck(_Handler):
    """A 201 acknowledgement, but of another report id."""

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        ack = {"status": "created", "report_id": "someone-else", "run_id": "r"}
        self._send(201, json.dumps(ack).encode(), "application/json")


class Trickle(_Handler):
    """Reads the request, then sends a valid-looking answer one byte per second."""

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        answer = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n\r\n{}"
        try:
            for byte in answer:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(1.0)
        except OSError:
            pass  # the client hung up: the point of the test


def redirect_to(location: str) -> type[_Handler]:
    class Redirect(_Handler):
        def do_POST(self) -> None:  # noqa: N802
            self._record()
            self._send(302, b"", "text/plain", Location=location)

    return Redirect


@contextmanager
def serve(handler: type[_Handler], log: Log | None = None) -> Iterator[tuple[str, Log]]:
    """Run ``handler`` on a free port of 127.0.0.1; yields (base URL, its request log)."""
    log = log or Log()
    bound = type(handler.__name__, (handler,), {"log": log})
    server = ThreadingHTTPServer(("127.0.0.1", 0), bound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()

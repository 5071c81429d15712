"""ASGI middleware (pure ASGI, no per-request task): refuse a request head over the size limit
and NUL characters in the request target, and add the security headers to every response."""

from __future__ import annotations

import json
from urllib.parse import unquote_to_bytes

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: The pages load only their own stylesheet and script (vendored under /static) and inline SVG.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


def _nul_in_target(scope: Scope) -> str | None:
    """Where a NUL sits in the path or query (PostgreSQL text cannot hold one), else None."""
    if "\x00" in scope.get("path", ""):
        return "path"
    query: bytes = scope.get("query_string", b"")
    if b"\x00" in unquote_to_bytes(query):
        return "query"
    return None


def _control_in_path(scope: Scope) -> bool:
    """A control character (newline, tab, ...) in the path: no stored model or run id holds one
    (ingest refuses them), and the path routes cannot match across a newline."""
    return any(0 < ord(c) < 0x20 or c == "\x7f" for c in scope.get("path", ""))


def _no_such_page(scope: Scope) -> Response:
    """A path with a control character: a browser gets the not-found page, an API client JSON."""
    from memest.service.errors import not_found_page, wants_page

    request = Request(scope)
    if wants_page(request) and not request.url.path.startswith("/api/"):
        return not_found_page(request, "No page at this address")
    return JSONResponse(
        status_code=404,
        content={"detail": "no such page: the path holds a control character", "field": "path"},
    )


def head_bytes(scope: Scope) -> int:
    """The request head's size as parsed: target and header lines (each "name: value\r\n")."""
    target = len(scope.get("raw_path") or scope.get("path", "").encode())
    target += len(scope.get("query_string", b""))
    return target + sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))


class HardeningMiddleware:
    def __init__(self, app: ASGIApp, max_head_bytes: int | None = None) -> None:
        self.app = app
        # uvicorn's h11 limit (MEMEST_MAX_HEADER_BYTES) holds only while a head is incomplete:
        # one that arrives whole in one read is parsed at any size, so it is measured here too.
        self.max_head_bytes = max_head_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS:
                    if name.decode() not in headers:
                        headers.raw.append((name, value))
            await send(message)

        if self.max_head_bytes is not None and head_bytes(scope) > self.max_head_bytes:
            refusal = JSONResponse(
                status_code=431,
                content={
                    "detail": f"the request head is larger than {self.max_head_bytes} bytes",
                    "field": "headers",
                },
                headers={"connection": "close"},  # such a client gets no second request
            )
            await refusal(scope, receive, send_with_headers)
            return
        if _control_in_path(scope):
            await _no_such_page(scope)(scope, receive, send_with_headers)
            return
        where = _nul_in_target(scope)
        if where is not None:
            refusal = JSONResponse(
                status_code=422,
                content={"detail": f"the request {where} contains a NUL character", "field": where},
            )
            await refusal(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


#: GET /healthz's answer (memest.service.routers.health documents the route).
HEALTHZ_PATH = "/healthz"
HEALTHZ_BODY = json.dumps({"status": "ok"}).encode()
_HEALTHZ_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(HEALTHZ_BODY)).encode()),
    *SECURITY_HEADERS,
]


class LivenessMiddleware:
    """The outermost layer: GET /healthz answered here, before every other middleware, the
    router and the dependencies, so that liveness costs the event loop two sends however busy
    the rest of the app is (a kubelet's probe must not queue behind the app's own work)."""

    def __init__(self, app: ASGIApp, max_head_bytes: int | None = None) -> None:
        self.app = app
        self.max_head_bytes = max_head_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == HEALTHZ_PATH
            and scope["method"] in ("GET", "HEAD")
            # an oversized head goes on to HardeningMiddleware's 431
            and (self.max_head_bytes is None or head_bytes(scope) <= self.max_head_bytes)
        ):
            await send({"type": "http.response.start", "status": 200, "headers": _HEALTHZ_HEADERS})
            body = b"" if scope["method"] == "HEAD" else HEALTHZ_BODY
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

"""Service errors, mapped to HTTP here once (business code never raises HTTPException).

- ServiceError (NotFound, BadRequest, ...): its status and message, naming its field;
- memest's domain errors, raised by the core under any route: ConfigError (DoesNotFitError
  included) is a 422 naming the refused field, any other MemestError a 422 saying the input
  cannot be used;
- pydantic's ValidationError, raised where a route validates a body (or a figure computed from
  absurd input falls out of range): a 422 naming the first field (memest.errors.first_error);
- the database failing (SQLAlchemy's OperationalError: a full disk, a lost connection): a 503;
- anything else: a 500, logged; every body is JSON ({"detail", "field"?}).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from markupsafe import escape
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from memest.errors import ConfigError, MemestError, first_error

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of the errors the service answers with a 4xx/5xx and a named field."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.message = message
        self.field = field
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in an ingest worker process: comes back as the same type, message and field.
        return (_restore, (type(self), self.message, dict(self.__dict__)))


def _restore(cls: type[ServiceError], message: str, state: dict[str, Any]) -> ServiceError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class BadRequest(ServiceError):
    status_code = 422


class PayloadTooLarge(ServiceError):
    status_code = 413


class UnsupportedMediaType(ServiceError):
    status_code = 415


class Unauthorized(ServiceError):
    status_code = 401


class Forbidden(ServiceError):
    status_code = 403


class RequestTimeout(ServiceError):
    """A request body that did not arrive in time."""

    status_code = 408


class TooManyRequests(ServiceError):
    """A client that must wait (failed logins); answered with Retry-After."""

    status_code = 429

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(ServiceError):
    """A calculator the route needs (memest.plan, memest.estimate) is not available, or no
    calculator worker was free in time; answered with Retry-After when ``retry_after_s``."""

    status_code = 503

    def __init__(self, message: str, *, field: str | None = None, retry_after_s: int = 0) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ServiceError):
    """A calculator request that ran past MEMEST_COMPUTE_DEADLINE_S (its worker was stopped)."""

    status_code = 504


def as_service_error(exc: BaseException) -> ServiceError | None:
    """The 4xx a domain or validation error is answered with (None: not one of those). Used by
    the handlers below and by the calculator workers, whose errors must cross a process boundary
    (a pydantic ValidationError does not pickle)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, ConfigError):
        return BadRequest(str(exc), field=exc.field)
    if isinstance(exc, MemestError):
        return BadRequest(f"memest cannot use this input: {exc}", field="body")
    if isinstance(exc, ValidationError):
        where, message, _ = first_error(exc)
        field = where or "body"
        return BadRequest(f"invalid {exc.title}: {field}: {message}", field=field)
    return None


def wants_page(request: Request) -> bool:
    """A browser navigating to a page (not an API client, not a form post)."""
    accept = request.headers.get("accept", "")
    return request.method == "GET" and "text/html" in accept


def not_found_page(request: Request, message: str) -> HTMLResponse:
    """A dashboard page that does not exist, as a page (an API path keeps its JSON answer)."""
    root = escape(str(request.scope.get("root_path", "")))
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Not found · memest'
        f'</title><link rel="stylesheet" href="{root}/static/memest.css"></head><body><header>'
        f'<a class="brand" href="{root}/">memest</a></header><main><h1>Not found</h1>'
        f'<p id="not-found">{escape(message)}.</p><p><a href="{root}/">All models</a></p>'
        "</main></body></html>"
    )
    return HTMLResponse(body, status_code=404)


def _answer(status: int, detail: str, field: str | None) -> JSONResponse:
    body: dict[str, object] = {"detail": detail}
    if field is not None:
        body["field"] = field
    return JSONResponse(status_code=status, content=body)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(MemestError)
    @app.exception_handler(ValidationError)
    async def _domain_error(request: Request, exc: Exception) -> Response:
        answer = as_service_error(exc)
        assert answer is not None  # both types map to a 422
        return await _service_error(request, answer)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # No route at this address: a browser gets a page, every other client FastAPI's JSON.
        if exc.status_code == 404 and wants_page(request):
            if not request.url.path.startswith("/api/"):
                return not_found_page(request, "No page at this address")
        return await http_exception_handler(request, exc)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        if exc.status_code == 401 and wants_page(request):
            # A person at a browser: send them to the login form, then back here.
            path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
            target = path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
        if exc.status_code == 404 and wants_page(request):
            if not request.url.path.startswith("/api/"):
                return not_found_page(request, exc.message)
        body: dict[str, object] = {"detail": exc.message}
        if exc.field is not None:
            body["field"] = exc.field
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        if isinstance(exc, TooManyRequests | Unavailable) and exc.retry_after_s:
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(status_code=exc.status_code, content=body, headers=headers)

    @app.exception_handler(OperationalError)
    async def _database_error(request: Request, exc: OperationalError) -> Response:
        # A full disk, a lost connection, a lock held too long: the database, not the request.
        log.error("database error on %s %s: %s", request.method, request.url.path, exc.orig)
        return _answer(503, "the database could not complete the request; try again later", None)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # Served by Starlette's outermost middleware: still one JSON body, never text/plain.
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _answer(500, "internal error (logged on the server)", None)

"""Service errors, mapped to HTTP in one handler (business code never raises HTTPException)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response


class ServiceError(Exception):
    """Base of the errors the service answers with a 4xx/5xx and a named field."""

    status_code = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.message = message
        self.field = field
        super().__init__(message)


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


class Unavailable(ServiceError):
    """A calculator the route needs (memest.plan, memest.estimate) is not available."""

    status_code = 503


def _wants_page(request: Request) -> bool:
    """A browser navigating to a page (not an API client, not a form post)."""
    accept = request.headers.get("accept", "")
    return request.method == "GET" and "text/html" in accept


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        if exc.status_code == 401 and _wants_page(request):
            # A person at a browser: send them to the login form, then back here.
            path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
            target = path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
        body: dict[str, object] = {"detail": exc.message}
        if exc.field is not None:
            body["field"] = exc.field
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse(status_code=exc.status_code, content=body, headers=headers)

"""GET/POST /login and POST /logout: a form that turns the read (or write) token into an
HttpOnly session cookie, so that a person can read the dashboard when MEMEST_READ_TOKEN is set.
The cookie names a server-side session (memest.service.sessions) that /logout deletes."""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Annotated
from urllib.parse import parse_qs

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from memest.service.deps import SettingsDep
from memest.service.errors import BadRequest, PayloadTooLarge, TooManyRequests
from memest.service.routers.dashboard import HTML_PAGE, templates
from memest.service.sessions import SESSION_COOKIE, SESSION_MAX_AGE_S, SessionStore

router = APIRouter(tags=["login"])

#: Longest login form body accepted (a token and a return path).
_MAX_FORM_BYTES = 8192
#: Failed logins one client address may make per LOGIN_WINDOW_S before it is answered 429.
LOGIN_FAILURES = 10
LOGIN_WINDOW_S = 60.0
#: Client addresses with recent failures kept before the quiet ones are dropped.
_MAX_CLIENTS = 10_000


class LoginLimiter:
    """Failed logins per client address over the last LOGIN_WINDOW_S (in this process): enough
    to turn guessing a token by the form into a few guesses a minute."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= now - LOGIN_WINDOW_S:
            failures.popleft()
        return failures

    def wait_s(self, client: str) -> float:
        """Seconds until ``client`` may try again (0 when it may now)."""
        with self._lock:
            now = self._clock()
            failures = self._recent(client, now)
            if len(failures) < LOGIN_FAILURES:
                if not failures:
                    self._failures.pop(client, None)  # no entry kept for a quiet client
                return 0.0
            return failures[0] + LOGIN_WINDOW_S - now

    def failed(self, client: str) -> None:
        with self._lock:
            now = self._clock()
            if len(self._failures) > _MAX_CLIENTS:  # many addresses: drop those gone quiet
                for quiet in [c for c, f in self._failures.items() if not self._recent(c, now)]:
                    del self._failures[quiet]
            self._recent(client, now).append(now)


def _limiter(request: Request) -> LoginLimiter:
    state = request.app.state
    if not hasattr(state, "login_limiter"):
        state.login_limiter = LoginLimiter()
    limiter: LoginLimiter = state.login_limiter
    return limiter


def _sessions(request: Request) -> SessionStore:
    sessions: SessionStore = request.app.state.login_sessions
    return sessions


def safe_next(target: str | None) -> str:
    """A same-site path to return to after login; anything else (another host, a scheme,
    a backslash trick) goes to the dashboard home."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    if any(ord(c) < 0x20 for c in target):
        return "/"
    return target


NextQuery = Annotated[
    str | None, Query(description="Path to return to after login", max_length=2000)
]


def _form_page(request: Request, next_path: str, error: str | None, status: int) -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        "login.html",
        {"title": "Log in · memest", "next": next_path, "error": error},
        status_code=status,
    )


@router.get("/login", response_class=HTMLResponse, responses=HTML_PAGE)
def login_form(request: Request, next: NextQuery = None) -> HTMLResponse:  # noqa: A002
    """The login form: paste MEMEST_READ_TOKEN (or the write token) once per browser."""
    return _form_page(request, safe_next(next), None, 200)


async def _read_form(request: Request) -> dict[str, str]:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            raise PayloadTooLarge(
                f"login form is larger than {_MAX_FORM_BYTES} bytes", field="body"
            )
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=10)
    except ValueError:  # more fields than a login form has
        raise BadRequest("login form has too many fields", field="body") from None
    return {k: v[0] for k, v in fields.items() if v}


# A browser form, not an API: kept out of the OpenAPI document.
@router.post("/login", include_in_schema=False)
async def login(request: Request, settings: SettingsDep) -> Response:
    """Check the token and set an HttpOnly session cookie; a wrong token shows the form again."""
    limiter = _limiter(request)
    client = request.client.host if request.client else "unknown"
    wait = limiter.wait_s(client)
    if wait > 0:
        raise TooManyRequests(
            f"too many failed logins from this address; try again in {math.ceil(wait)} s",
            retry_after_s=math.ceil(wait),
        )
    form = await _read_form(request)
    next_path = safe_next(form.get("next"))
    given = form.get("token", "").encode()
    token = next(
        (
            t
            for t in (settings.read_token, settings.write_token)
            if t is not None and hmac.compare_digest(given, t.get_secret_value().encode())
        ),
        None,
    )
    if token is None:
        limiter.failed(client)
        return _form_page(request, next_path, "That token is not the server's.", 401)
    session_id = await anyio.to_thread.run_sync(_sessions(request).create, token)
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=SESSION_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout", include_in_schema=False)
def logout(request: Request) -> Response:
    """End the session (its row is deleted, so the cookie is refused from now on, on every
    replica) and clear the cookie."""
    given = request.cookies.get(SESSION_COOKIE)
    if given:
        _sessions(request).revoke(given)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response

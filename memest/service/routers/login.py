"""GET/POST /login and POST /logout: a form that turns the read (or write) token into an
HttpOnly session cookie, so that a person can read the dashboard when MEMEST_READ_TOKEN is set.
The cookie names a server-side session (memest.service.sessions) that /logout deletes."""

from __future__ import annotations

import hmac
from typing import Annotated
from urllib.parse import parse_qs

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from memest.service.deps import SettingsDep
from memest.service.errors import BadRequest, PayloadTooLarge, RequestTimeout
from memest.service.ratelimit import client_address, failure_limiter
from memest.service.sessions import SESSION_COOKIE, SESSION_MAX_AGE_S, SessionStore
from memest.service.templating import HTML_PAGE, templates

router = APIRouter(tags=["login"])

#: Longest login form body accepted (a token and a return path).
_MAX_FORM_BYTES = 8192
#: Seconds a client has to send the whole login form (a few hundred bytes): a client trickling
#: it cannot hold a connection longer.
LOGIN_BODY_TIMEOUT_S = 10.0


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
    try:
        with anyio.fail_after(LOGIN_BODY_TIMEOUT_S):
            async for chunk in request.stream():
                body += chunk
                if len(body) > _MAX_FORM_BYTES:
                    raise PayloadTooLarge(
                        f"login form is larger than {_MAX_FORM_BYTES} bytes", field="body"
                    )
    except TimeoutError:
        raise RequestTimeout(
            f"login form not received within {LOGIN_BODY_TIMEOUT_S:g} s", field="body"
        ) from None
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=10)
    except ValueError:  # more fields than a login form has
        raise BadRequest("login form has too many fields", field="body") from None
    return {k: v[0] for k, v in fields.items() if v}


# A browser form, not an API: kept out of the OpenAPI document.
@router.post("/login", include_in_schema=False)
async def login(request: Request, settings: SettingsDep) -> Response:
    """Check the token (read or admin; the push-only token opens no session) and set an
    HttpOnly session cookie; a wrong token shows the form again. Failed logins and wrong bearer
    tokens share one limit per client (memest.service.ratelimit)."""
    limiter, client = failure_limiter(request), client_address(request)
    limiter.check(client, "logins")
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

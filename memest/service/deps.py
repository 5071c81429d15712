"""Request dependencies: settings, sessions, the parsed-report cache and bearer-token checks
(scopes: push-only, read, admin).

The trivial ones are ``async`` so that FastAPI calls them on the event loop instead of handing
each to the thread pool (a measurable cost at hundreds of requests per second).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Annotated

import anyio
from fastapi import Depends, Request, params
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from memest.service.compute import ComputePool
from memest.service.config import Settings
from memest.service.db import read_session
from memest.service.errors import Forbidden, Unauthorized
from memest.service.metrics import ServiceMetrics
from memest.service.ratelimit import client_address, failure_limiter
from memest.service.sessions import SESSION_COOKIE, SessionStore
from memest.service.store import ReportCache, ResponseCache

_bearer = HTTPBearer(
    auto_error=False, description="MEMEST_PUSH_TOKEN / MEMEST_READ_TOKEN / MEMEST_WRITE_TOKEN"
)


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    return factory


def get_session(request: Request) -> Iterator[Session]:
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    with read_session(factory) as session:
        yield session


async def get_cache(request: Request) -> ReportCache:
    cache: ReportCache = request.app.state.report_cache
    return cache


async def get_response_cache(request: Request) -> ResponseCache:
    responses: ResponseCache = request.app.state.response_cache
    return responses


async def get_compute(request: Request) -> ComputePool:
    pool: ComputePool = request.app.state.compute_pool
    return pool


async def get_metrics(request: Request) -> ServiceMetrics:
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
FactoryDep = Annotated[sessionmaker[Session], Depends(get_factory)]
CacheDep = Annotated[ReportCache, Depends(get_cache)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
ComputeDep = Annotated[ComputePool, Depends(get_compute)]
ResponseCacheDep = Annotated[ResponseCache, Depends(get_response_cache)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _matches(creds: HTTPAuthorizationCredentials | None, *tokens: SecretStr | None) -> bool:
    if creds is None:
        return False
    given = creds.credentials.encode()
    # Every token compared (no early exit), each in constant time.
    found = [
        t is not None and hmac.compare_digest(given, t.get_secret_value().encode()) for t in tokens
    ]
    return any(found)


def _check_bearer(
    request: Request, settings: Settings, creds: HTTPAuthorizationCredentials | None
) -> None:
    """A bearer token that is none of the server's counts as a failed attempt of its client
    (memest.service.ratelimit); a client past the limit is answered 429 before any check."""
    if creds is None:
        return
    limiter, client = failure_limiter(request), client_address(request)
    limiter.check(client, "token attempts")
    if not _matches(creds, settings.write_token, settings.push_token, settings.read_token):
        limiter.failed(client)
        raise Unauthorized("wrong bearer token", field="token")


def _count_unauthorized(request: Request) -> None:
    metrics: ServiceMetrics = request.app.state.metrics
    metrics.ingested.labels(outcome="unauthorized").inc()


async def require_push(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    """Pushing a report needs ``Authorization: Bearer`` MEMEST_PUSH_TOKEN or MEMEST_WRITE_TOKEN;
    with neither set, none pass."""
    try:
        if settings.write_token is None and settings.push_token is None:
            raise Forbidden(
                "writes are disabled: the server has no MEMEST_PUSH_TOKEN or MEMEST_WRITE_TOKEN",
                field="token",
            )
        if creds is None:
            raise Unauthorized("missing bearer token (Authorization: Bearer ...)", field="token")
        _check_bearer(request, settings, creds)
        if not _matches(creds, settings.push_token, settings.write_token):
            raise Forbidden("this token may not push reports", field="token")
    except (Forbidden, Unauthorized):
        _count_unauthorized(request)
        raise


async def require_write(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    """Admin writes (DELETE) need ``Authorization: Bearer $MEMEST_WRITE_TOKEN``; the push and
    read tokens are refused (403)."""
    if settings.write_token is None:
        raise Forbidden("writes are disabled: the server has no MEMEST_WRITE_TOKEN", field="token")
    if creds is None:
        raise Unauthorized("missing bearer token (Authorization: Bearer ...)", field="token")
    _check_bearer(request, settings, creds)
    if not _matches(creds, settings.write_token):
        raise Forbidden("this needs the admin token (MEMEST_WRITE_TOKEN)", field="token")


async def _session_matches(request: Request, *tokens: SecretStr | None) -> bool:
    given = request.cookies.get(SESSION_COOKIE)
    if not given:
        return False
    sessions: SessionStore = request.app.state.login_sessions
    # A database read: off the event loop, like the other database work.
    return await anyio.to_thread.run_sync(sessions.valid, given, tokens)


async def require_read(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    """Reads are open unless MEMEST_READ_TOKEN is set; then the read or write token is needed,
    as a bearer token or as the cookie of a live login session (memest.service.sessions). The
    push token never reads."""
    if settings.read_token is None:
        return
    tokens = (settings.read_token, settings.write_token)
    if creds is not None:
        _check_bearer(request, settings, creds)
        if not _matches(creds, *tokens):
            raise Forbidden("this token may not read (it is the push-only token)", field="token")
        return
    if not await _session_matches(request, *tokens):
        raise Unauthorized("reads need a bearer token (MEMEST_READ_TOKEN)", field="token")


async def _once(
    request: Request,
    settings: Settings,
    creds: HTTPAuthorizationCredentials | None,
    check: Callable[..., Awaitable[None]],
) -> None:
    """``check`` unless this request passed it already (authorize runs it ahead of FastAPI)."""
    passed: set[str] = request.scope.setdefault("memest.authorized", set())
    if check.__name__ not in passed:
        await check(request, settings, creds)
        passed.add(check.__name__)


async def push_auth(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    await _once(request, settings, creds, require_push)


async def read_auth(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    await _once(request, settings, creds, require_read)


async def write_auth(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    await _once(request, settings, creds, require_write)


_ROUTE_CHECKS = (push_auth, read_auth, write_auth)


async def authorize(request: Request, dependencies: Iterable[params.Depends]) -> None:
    """Run the token checks among a route's ``dependencies`` now, ahead of FastAPI (which reads
    and validates a body before it solves dependencies): a body is parsed only for a client the
    route lets in. FastAPI's own call of each check then finds it passed."""
    settings: Settings = request.app.state.settings
    creds = await _bearer(request)
    for dep in dependencies:
        if dep.dependency in _ROUTE_CHECKS:
            await dep.dependency(request, settings, creds)


PushAuth = Depends(push_auth)
WriteAuth = Depends(write_auth)
ReadAuth = Depends(read_auth)

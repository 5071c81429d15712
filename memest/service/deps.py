"""Request dependencies: settings, sessions, the parsed-report cache and bearer-token checks.

The trivial ones are ``async`` so that FastAPI calls them on the event loop instead of handing
each to the thread pool (a measurable cost at hundreds of requests per second).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from memest.service.config import Settings
from memest.service.errors import Forbidden, Unauthorized
from memest.service.metrics import ServiceMetrics
from memest.service.sessions import SESSION_COOKIE, SessionStore
from memest.service.store import ReportCache, ResponseCache

_bearer = HTTPBearer(auto_error=False, description="MEMEST_WRITE_TOKEN / MEMEST_READ_TOKEN")


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    return factory


def get_session(request: Request) -> Iterator[Session]:
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    with factory() as session:
        yield session


async def get_cache(request: Request) -> ReportCache:
    cache: ReportCache = request.app.state.report_cache
    return cache


async def get_response_cache(request: Request) -> ResponseCache:
    responses: ResponseCache = request.app.state.response_cache
    return responses


async def get_metrics(request: Request) -> ServiceMetrics:
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
FactoryDep = Annotated[sessionmaker[Session], Depends(get_factory)]
CacheDep = Annotated[ReportCache, Depends(get_cache)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
ResponseCacheDep = Annotated[ResponseCache, Depends(get_response_cache)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _matches(creds: HTTPAuthorizationCredentials | None, *tokens: SecretStr | None) -> bool:
    if creds is None:
        return False
    given = creds.credentials.encode()
    return any(
        t is not None and hmac.compare_digest(given, t.get_secret_value().encode()) for t in tokens
    )


async def require_write(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    """Writes need ``Authorization: Bearer $MEMEST_WRITE_TOKEN``; with no token set, none pass."""
    error: Forbidden | Unauthorized | None = None
    if settings.write_token is None:
        error = Forbidden(
            "writes are disabled: the server has no MEMEST_WRITE_TOKEN", field="token"
        )
    elif creds is None:
        error = Unauthorized("missing bearer token (Authorization: Bearer ...)", field="token")
    elif not _matches(creds, settings.write_token):
        error = Unauthorized("wrong bearer token", field="token")
    if error is not None:
        metrics: ServiceMetrics = request.app.state.metrics
        metrics.ingested.labels(outcome="unauthorized").inc()
        raise error


async def _session_matches(request: Request, *tokens: SecretStr | None) -> bool:
    given = request.cookies.get(SESSION_COOKIE)
    if not given:
        return False
    sessions: SessionStore = request.app.state.login_sessions
    # A database read: off the event loop, like the other database work.
    return await anyio.to_thread.run_sync(sessions.valid, given, tokens)


async def require_read(request: Request, settings: SettingsDep, creds: CredentialsDep) -> None:
    """Reads are open unless MEMEST_READ_TOKEN is set; then the read or write token is needed,
    as a bearer token or as the cookie of a live login session (memest.service.sessions)."""
    if settings.read_token is None:
        return
    tokens = (settings.read_token, settings.write_token)
    if not (_matches(creds, *tokens) or await _session_matches(request, *tokens)):
        raise Unauthorized("reads need a bearer token (MEMEST_READ_TOKEN)", field="token")


WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)

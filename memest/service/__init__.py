"""The memest service: FastAPI + SQLAlchemy, installed with ``pip install 'vllm-memest[service]'``.

Usage::

    from memest.service import create_app
    from memest.service.config import Settings

    app = create_app(Settings(database_url="sqlite:///./memest.db", write_token="a-long-write-token-here"))

Environment variables (see :class:`memest.service.config.Settings`): MEMEST_DATABASE_URL,
MEMEST_WRITE_TOKEN, MEMEST_READ_TOKEN, MEMEST_MAX_REPORT_BYTES, MEMEST_DEMO,
MEMEST_REPORT_CACHE_SIZE, MEMEST_METRICS_MAX_STALE_S; for ``memest serve``'s uvicorn (memest.service.server): MEMEST_HEADER_TIMEOUT_S,
MEMEST_MAX_HEADER_BYTES, MEMEST_KEEP_ALIVE_TIMEOUT_S, MEMEST_MAX_CONNECTIONS, MEMEST_BACKLOG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from memest.service.config import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service app for ``settings`` (default: from MEMEST_* env vars).

    The import is deferred so that ``memest.service.plans`` stays importable without FastAPI.
    """
    from memest.service.app import create_app as _create_app

    return _create_app(settings)


__all__ = ["create_app"]

"""Service settings, read from MEMEST_* environment variables (pydantic-settings)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from memest.units import MiB


class Settings(BaseSettings):
    """Configuration of the memest service; every field reads ``MEMEST_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="MEMEST_", env_ignore_empty=True, extra="ignore")

    database_url: str = Field(
        default="sqlite:///./memest.db",
        description="SQLAlchemy URL. SQLite (WAL mode) by default; "
        "postgresql+psycopg://user@host:5432/db for shared deployments",
    )
    write_token: SecretStr | None = Field(
        default=None,
        description="Bearer token that POST /api/v1/reports requires; unset = writes refused",
    )
    read_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for reads (API, dashboard, /metrics, /openapi.json; browsers "
        "log in at /login); unset = open",
    )
    max_report_bytes: int = Field(
        default=4 * MiB, ge=1024, description="Largest accepted report body, in bytes"
    )
    demo: bool = Field(
        default=False,
        description="Load the demo reports at startup: real H200 starts and published figures (idempotent)",
    )
    report_cache_size: int = Field(
        default=512, ge=0, description="Parsed reports kept in memory (reports are immutable)"
    )
    metrics_max_stale_s: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds by which /metrics may lag the database: a scrape is answered from "
        "the last build of the exposition when its state was read at most this long ago (a "
        "build runs in the background meanwhile); 0 = every scrape waits for the current state",
    )
    ingest_processes: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Worker processes that parse reports and compute their stored form (the CPU "
        "work of an ingest, which would otherwise hold the server's GIL while pages wait); "
        "0 = in the server's ingest threads",
    )

    # memest serve's uvicorn (memest.service.server): every read from a client is bounded.
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds a client has to send a whole request head (from the connection, or "
        "from the first byte of a keep-alive request); then the connection is closed",
    )
    max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        le=MiB,
        description="Largest request head (request line and headers), in bytes; larger is a 400",
    )
    keep_alive_timeout_s: int = Field(
        default=5, ge=1, le=600, description="Seconds an idle keep-alive connection is kept"
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Open connections (or running requests) past which a request is answered 503",
    )
    backlog: int = Field(
        default=2048, ge=1, le=65535, description="Connections the kernel queues before accept"
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()

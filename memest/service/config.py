"""Service settings, read from MEMEST_* environment variables (pydantic-settings)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memest.units import MiB

#: Shortest bearer token accepted: a token any shorter is guessable (16 characters of hex are
#: 64 bits, and a guess costs a request that the bearer-failure limit throttles).
MIN_TOKEN_CHARS = 16


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
        description="Admin bearer token: pushes, reads and DELETE /api/v1/runs/{id}; "
        "unset = writes refused",
    )
    push_token: SecretStr | None = Field(
        default=None,
        description="Push-only bearer token (for vLLM pods): POST /api/v1/reports and nothing "
        "else (no reads when MEMEST_READ_TOKEN is set, no DELETE, no login)",
    )
    read_token: SecretStr | None = Field(
        default=None,
        description="Bearer token for reads (API, dashboard, /metrics, /openapi.json; browsers "
        "log in at /login); unset = open",
    )
    forwarded_allow_ips: str = Field(
        default="",
        max_length=4096,
        description="Comma-separated proxy addresses or networks (or '*') whose "
        "X-Forwarded-For/-Proto headers are honoured; empty = none (the client is the peer "
        "address, so a forwarded header cannot reset a per-client limit)",
    )
    max_connections_per_client: int = Field(
        default=64,
        ge=1,
        le=1_000_000,
        description="Open connections one client address may hold (a trusted proxy is exempt); "
        "past it a new connection is answered 503 and closed",
    )
    compute_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Worker processes for the pre-flight, what-if and estimate calculators "
        "(never on the event loop); more concurrent requests wait for a free worker",
    )
    compute_deadline_s: float = Field(
        default=20.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds a calculator request or a page build may wait for a worker and run; "
        "past it the worker is stopped and the answer is a 504 (ran too long) or 503 (no worker "
        "was free)",
    )
    page_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Worker processes (spawned on first use) that parse stored reports and render "
        "the model, compare and history pages, so that a page build never holds the server's "
        "GIL; more concurrent builds wait for a free worker",
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

    @field_validator("write_token", "push_token", "read_token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        """A token as a client can send it: surrounding whitespace (a Secret file's newline)
        dropped, as the token file and the plugin's MEMEST_TOKEN are read; at least
        MIN_TOKEN_CHARS characters, all printable ASCII (an Authorization header cannot carry
        a control character or, portably, anything past ASCII)."""
        if token is None:
            return None
        text = token.get_secret_value().strip()
        if len(text) < MIN_TOKEN_CHARS:
            raise ValueError(f"a token must be at least {MIN_TOKEN_CHARS} characters")
        if not all(" " <= c <= "~" for c in text):
            raise ValueError(
                "a token must be printable ASCII characters (it is sent in an Authorization header)"
            )
        return SecretStr(text)

    def trusted_proxies(self) -> list[str]:
        """MEMEST_FORWARDED_ALLOW_IPS as a list (empty: no proxy is trusted)."""
        return [a.strip() for a in self.forwarded_allow_ips.split(",") if a.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()

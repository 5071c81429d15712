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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()

"""Engine and session factory per app (no engine at import time) and Alembic upgrades."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

#: Execution option that makes a SQLite transaction take the write lock at BEGIN, so concurrent
#: writers queue on busy_timeout instead of failing when a read transaction upgrades.
SQLITE_IMMEDIATE = "memest_sqlite_immediate"


def make_engine(url: str) -> Engine:
    """Create the engine for ``url``; SQLite gets WAL mode, a busy timeout and foreign keys."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    memory = url in ("sqlite://", "sqlite:///:memory:")
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}}
    if memory:
        kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN (IMMEDIATE) is ours to emit.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(SQLITE_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


def alembic_config() -> Config:
    """Alembic configuration pointing at the migrations shipped in this package."""
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("memest.service") / "migrations"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema of ``engine``'s database to ``revision`` (idempotent)."""
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


@contextmanager
def read_session(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose reads all see one snapshot: on PostgreSQL a REPEATABLE READ transaction
    (a read-only one never fails to serialize), so a run deleted meanwhile is either whole or
    gone, never half (a 404 or the old answer, not a 500). SQLite's read transactions are
    snapshots already."""
    with factory() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        yield session


@contextmanager
def write_session(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose transaction holds the SQLite write lock from BEGIN; commits or rolls back."""
    with factory() as session:
        session.connection(execution_options={SQLITE_IMMEDIATE: True})
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise

"""Service fixtures: apps on SQLite (a temp file, WAL) and on PostgreSQL (a private schema)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from memest.service import create_app  # noqa: E402
from memest.service.config import Settings  # noqa: E402
from tests.conftest import require_or_skip  # noqa: E402
from tests.live_server import serve  # noqa: E402

TOKEN = "test-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PG_URL = os.environ.get("MEMEST_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_admin_url() -> str:
    return PG_URL.replace("postgresql+psycopg://", "postgresql://")


@contextmanager
def pg_schema(prefix: str = "memest_test") -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards."""
    try:
        import psycopg

        conn = psycopg.connect(_pg_admin_url(), autocommit=True, connect_timeout=3)
    except Exception as exc:  # any failure to reach the server means "no PostgreSQL here"
        require_or_skip("MEMEST_REQUIRE_POSTGRES", f"PostgreSQL unreachable at {PG_URL}: {exc}")
        raise
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_pg_admin_url(), autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def pg_url() -> Iterator[str]:
    with pg_schema() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'memest.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Both backends: storage tests run once on SQLite and once on PostgreSQL."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(sqlite_url: str) -> Iterator[MakeClient]:
    """Build a started TestClient; defaults: SQLite temp file, write token TOKEN."""
    clients: list[TestClient] = []

    def make(**overrides: object) -> TestClient:
        kwargs: dict[str, object] = {"database_url": sqlite_url, "write_token": TOKEN}
        kwargs.update(overrides)
        client = TestClient(create_app(Settings(**kwargs)))  # type: ignore[arg-type]
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    return make_client()


@pytest.fixture
def demo_client(make_client: MakeClient) -> TestClient:
    return make_client(demo=True)


@pytest.fixture
def live_server(sqlite_url: str) -> Iterator[str]:
    """A real uvicorn on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    app = create_app(Settings(database_url=sqlite_url, write_token=TOKEN))  # type: ignore[arg-type]
    with serve(app, start_timeout_s=15) as url:
        yield url


#: One sample of /metrics: its name and labels (sorted), with the series set's labels read back
#: from memest_run_info in place of ``key``.
Sample = tuple[str, tuple[tuple[str, str], ...]]


def joined_samples(text: str) -> dict[Sample, float]:
    """Every value sample of a /metrics text, parsed by prometheus_client's parser, each
    labelled as PromQL's ``* on(model, key) group_left(build, config, mode, sized_by)
    memest_run_info`` labels it (without ``key``); a repeated series, or a key without its info
    line, fails the test. The info families themselves are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    info: dict[tuple[str, str], dict[str, str]] = {}
    values = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "memest_run_info":
                assert s.value == 1
                key = (s.labels["model"], s.labels["key"])
                assert key not in info, f"two memest_run_info lines for {key}"
                info[key] = {k: v for k, v in s.labels.items() if k != "key"}
            elif s.name != "memest_owner_info":
                values.append(s)
    samples: dict[Sample, float] = {}
    for s in values:
        labels = dict(s.labels)
        if "key" in labels:
            labels.update(info[(labels["model"], labels.pop("key"))])
        name = (s.name, tuple(sorted(labels.items())))
        assert name not in samples, f"/metrics repeats {name}"
        samples[name] = s.value
    return samples

"""/metrics under a stream of writes: a scrape is answered from the last build (at most
MEMEST_METRICS_MAX_STALE_S old) while writes are in progress on the replica, waits for the
current state otherwise and after a DELETE here, and a restarted server builds before the first
scrape asks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from memest.service import db, metrics_cache, store
from memest.service.ingest import parse_report
from memest.service.metrics_cache import MetricsCache, metric_rows_json
from tests.integration.service.conftest import MakeClient
from tests.integration.service.test_fleet_metrics import _post, _report

#: Long enough that no build in a test is ever too old to be served while writes are in progress.
HOUR = 3600.0


def _store(factory: Any, run: str, model: str) -> None:
    report = parse_report(json.dumps(_report(run, model)).encode())
    store.ingest(factory, report, metric_rows_json(report))


def _cache(url: str, max_stale_s: float) -> tuple[Any, MetricsCache]:
    engine = db.make_engine(url)
    db.upgrade(engine)
    factory = db.make_sessionmaker(engine)
    return factory, MetricsCache(
        factory, lambda row: parse_report(row.payload.encode()), max_stale_s
    )


def _models(text: bytes) -> set[str]:
    return {
        line.split('model="', 1)[1].split('"', 1)[0]
        for line in text.decode().splitlines()
        if line.startswith("memest_run_info{")
    }


def test_a_scrape_during_writes_is_answered_from_the_last_build(db_url: str) -> None:
    factory, cache = _cache(db_url, HOUR)
    try:
        _store(factory, "one", "fleet/one")
        assert _models(cache.exposition()) == {"fleet/one"}
        _store(factory, "two", "fleet/two")
        with cache.writing():  # a write in progress: the last build answers at once
            assert _models(cache.exposition()) == {"fleet/one"}
            assert _models(cache.exposition()) <= {"fleet/one", "fleet/two"}
        # No write in progress: the scrape waits for the current state.
        assert _models(cache.exposition()) == {"fleet/one", "fleet/two"}
    finally:
        cache.stop()


def test_without_staleness_a_scrape_during_writes_waits(db_url: str) -> None:
    factory, cache = _cache(db_url, 0.0)
    _store(factory, "one", "fleet/one")
    assert _models(cache.exposition()) == {"fleet/one"}
    _store(factory, "two", "fleet/two")
    with cache.writing():
        assert _models(cache.exposition()) == {"fleet/one", "fleet/two"}


def test_after_a_delete_here_a_scrape_during_writes_waits(db_url: str) -> None:
    factory, cache = _cache(db_url, HOUR)
    try:
        _store(factory, "one", "fleet/one")
        _store(factory, "two", "fleet/two")
        assert _models(cache.exposition()) == {"fleet/one", "fleet/two"}
        store.delete_run(factory, "two")
        cache.deleted()
        with cache.writing():
            assert _models(cache.exposition()) == {"fleet/one"}
            # The same ids stored again with another model: the new content, never the old.
            _store(factory, "two", "fleet/again")
            assert _models(cache.exposition()) == {"fleet/one", "fleet/again"}
    finally:
        cache.stop()


def test_gzip_of_a_build_served_during_writes_is_that_build(db_url: str) -> None:
    import gzip

    factory, cache = _cache(db_url, HOUR)
    try:
        _store(factory, "one", "fleet/one")
        text = cache.exposition()
        _store(factory, "two", "fleet/two")
        with cache.writing():
            assert gzip.decompress(cache.gzipped(b"tail\n")) == text + b"tail\n"
    finally:
        cache.stop()


def test_a_restarted_server_builds_before_the_first_scrape(
    make_client: MakeClient, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = make_client()
    for k in range(3):
        _post(first, _report(f"s{k}", f"fleet/s{k}"))
    restarted = make_client(database_url=sqlite_url)
    app: Any = restarted.app
    assert app.state.metrics_cache.wait_built(timeout=60)

    def refuse(samples: list[Any]) -> None:
        raise AssertionError("the first scrape rendered a run: the startup build was not used")

    monkeypatch.setattr(metrics_cache, "_render", refuse)
    text = restarted.get("/metrics").text
    assert {f"fleet/s{k}" for k in range(3)} <= _models(text.encode())


def test_a_scrape_after_a_write_on_the_same_server_sees_it(make_client: MakeClient) -> None:
    # The default staleness applies only while writes are in progress: a write that has been
    # answered is in the next scrape.
    client: TestClient = make_client()
    app: Any = client.app
    assert app.state.settings.metrics_max_stale_s > 0
    client.get("/metrics")
    _post(client, _report("seen", "fleet/seen"))
    assert "fleet/seen" in _models(client.get("/metrics").content)


def test_first_set_reads_the_set_as_the_full_decode_does() -> None:
    report = parse_report(json.dumps(_report("x", 'fleet/q"uote')).encode())
    rows = metric_rows_json(report)
    assert rows is not None
    samples = json.loads(rows)
    assert metrics_cache._first_set(rows) == metrics_cache._series_set(samples)
    assert metrics_cache._first_set(rows) is not None
    # The set's labels carried only by a later sample, and none at all.
    unlabelled = [["f", "f", {}, 1.0], *samples]
    assert metrics_cache._first_set(json.dumps(unlabelled)) == metrics_cache._series_set(samples)
    assert metrics_cache._first_set(json.dumps([["f", "f", {}, 1.0]])) is None
    assert metrics_cache._first_set("[]") is None

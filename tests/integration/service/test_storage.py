"""Storage on both backends (SQLite file in WAL mode, PostgreSQL): migrations, atomic ingest,
concurrent writers, and the API on top."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, MetaData, Table, func, inspect, select, text

from memest.builds.runs import fingerprint
from memest.demo import demo_report, demo_reports
from memest.schema import RunReport
from memest.service import create_app, db, store
from memest.service.config import Settings
from memest.service.models import Report, Run
from tests.integration.service.conftest import AUTH, TOKEN


def _variant(i: int, rank: int = 0) -> RunReport:
    data = json.loads(demo_report("deepseek-v4-flash-dspark-k7", "PR").model_dump_json())
    data.update(
        report_id=f"w-{i}-r{rank}", run_id=f"w-{i}", rank=rank, source="synthetic", world_size=2
    )
    return RunReport.model_validate(data)


def test_migrations_upgrade_idempotently_and_downgrade(db_url: str) -> None:
    engine = db.make_engine(db_url)
    try:
        db.upgrade(engine)
        db.upgrade(engine)
        names = set(inspect(engine).get_table_names())
        assert {"runs", "reports", "sessions", "alembic_version"} <= names
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0005"
        from alembic import command

        cfg = db.alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert not {"runs", "reports", "sessions"} & set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_match_the_models(db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from memest.service.models import Base

    engine = db.make_engine(db_url)
    try:
        db.upgrade(engine)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
    finally:
        engine.dispose()


def _store_at_0001(engine: Engine, reports: list[RunReport | tuple[str, str]]) -> None:
    """Rows as revision 0001 stored them: each RunReport verbatim, or (run_id, payload) for a
    payload that no longer reads as a report."""
    with engine.begin() as conn:
        meta = MetaData()
        runs = Table("runs", meta, autoload_with=conn)
        rows = Table("reports", meta, autoload_with=conn)
        assert "config_fingerprint" not in runs.c
        now = datetime.now(UTC)
        for i, item in enumerate(reports):
            if isinstance(item, RunReport):
                rep, payload = item, item.model_dump_json()
            else:
                rep = demo_report("minimax-m3-eagle3-k3", "PR").model_copy(
                    update={"run_id": item[0]}
                )
                payload = item[1]
            if conn.scalar(select(runs.c.run_id).where(runs.c.run_id == rep.run_id)) is None:
                conn.execute(
                    runs.insert().values(
                        run_id=rep.run_id,
                        model=rep.model,
                        build_label=rep.build.label,
                        source=rep.source,
                        world_size=rep.world_size,
                        created_at=rep.created_at,
                        ingested_at=now,
                    )
                )
            conn.execute(
                rows.insert().values(
                    report_id=f"{rep.run_id}-{i}",
                    run_id=rep.run_id,
                    rank=rep.rank,
                    schema_version=rep.schema_version,
                    payload=payload,
                    payload_sha256="0" * 64,
                    size_bytes=len(payload),
                    ingested_at=now,
                )
            )


def _configured(i: int, rank: int = 0, **config: object) -> RunReport:
    rep = _variant(i, rank)
    data = json.loads(rep.model_dump_json())
    data["config"].update(config)
    data["created_at"] = f"2026-12-01T10:{i:02d}:00Z"
    return RunReport.model_validate(data)


def test_migration_0002_fills_each_runs_fingerprint_from_its_lead_report(db_url: str) -> None:
    # GIVEN a database created at revision 0001 holding runs: w-1 of two ranks, its rank 1 stored
    # first and carrying a fingerprint of its own; w-2 at another utilization; w-3 whose stated
    # fingerprint is longer than the column; w-4 whose payload no longer reads as a report
    engine = db.make_engine(db_url)
    try:
        db.upgrade(engine, "0001")
        rank1 = _configured(1, 1).model_copy(update={"config_fingerprint": "rank1-own"})
        long_fp = _configured(3, gpu_memory_utilization=0.8)
        long_fp = long_fp.model_copy(update={"config_fingerprint": "f" * 300})
        _store_at_0001(
            engine,
            [
                rank1,
                _configured(1, 0),
                _configured(2, gpu_memory_utilization=0.7),
                long_fp,
                ("w-4", '{"not": "a report"}'),
            ],
        )
        # WHEN it is upgraded
        db.upgrade(engine)
        # THEN every run carries its lead report's fingerprint, as the history computes it
        with engine.connect() as conn:
            stored = dict(conn.execute(text("SELECT run_id, config_fingerprint FROM runs")).all())
        assert stored == {
            "w-1": fingerprint(_configured(1, 0)),
            "w-2": fingerprint(_configured(2, gpu_memory_utilization=0.7)),
            "w-3": None,
            "w-4": None,
        }
        assert stored["w-1"] != stored["w-2"]
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM reports WHERE run_id = 'w-4'"))
            conn.execute(text("DELETE FROM runs WHERE run_id = 'w-4'"))
    finally:
        engine.dispose()
    # AND /metrics exports one series per configuration, labelled as the history page shows it
    app = create_app(Settings(database_url=db_url, write_token=TOKEN))  # type: ignore[arg-type]
    with TestClient(app) as c:
        model = _variant(1).model
        points = c.get("/api/v1/history", params={"model": model}).json()["points"]
        shown = {p["run_id"]: p["config_fingerprint"] for p in points}
        assert shown == {"w-1": stored["w-1"], "w-2": stored["w-2"], "w-3": "f" * 300}
        page = c.get(f"/history/{model}").text
        assert all(fp in page for fp in shown.values())
        metrics = c.get("/metrics").text
        configs = re.findall(r'^memest_run_info\{.*config="([^"]*)"', metrics, re.M)
        assert sorted(configs) == sorted(shown.values())


def test_a_runs_fingerprint_is_its_lead_reports_whichever_rank_arrives_first(db_url: str) -> None:
    # GIVEN a run whose rank 1 arrives first, stating a fingerprint of its own
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    factory = db.make_sessionmaker(engine)
    rank1 = _configured(5, 1).model_copy(update={"config_fingerprint": "rank1-own"})
    store.ingest(factory, rank1)
    with factory() as s:
        assert s.get(Run, "w-5").config_fingerprint == "rank1-own"  # type: ignore[union-attr]
    # WHEN rank 0 arrives, THEN the run takes the lead report's fingerprint
    store.ingest(factory, _configured(5, 0))
    # AND a later rank of a run stored from rank 0 changes nothing
    store.ingest(factory, _configured(6, 0))
    store.ingest(factory, _configured(6, 1).model_copy(update={"config_fingerprint": "own"}))
    with factory() as s:
        stored = {r.run_id: r.config_fingerprint for r in s.scalars(select(Run))}
    assert stored == {"w-5": fingerprint(_configured(5, 0)), "w-6": fingerprint(_configured(6, 0))}
    engine.dispose()


def test_sqlite_runs_in_wal_mode(sqlite_url: str) -> None:
    engine = db.make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        engine.dispose()


def test_a_failing_report_leaves_nothing_half_written(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a store where building the report row fails after the run row was added
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    factory = db.make_sessionmaker(engine)

    def boom(_value: int | None, _field: str) -> int:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store, "_int64", boom)
    # WHEN a new run's first report is ingested
    with pytest.raises(RuntimeError):
        store.ingest(factory, _variant(1))
    # THEN neither the run nor the report exists
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(Run)) == 0
        assert s.scalar(select(func.count()).select_from(Report)) == 0
    engine.dispose()


def test_concurrent_writers_lose_nothing(db_url: str) -> None:
    # GIVEN 8 writers racing on 60 reports (30 runs x 2 ranks), every report sent twice
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    factory = db.make_sessionmaker(engine)
    reports = [_variant(i, rank) for i in range(30) for rank in (0, 1)]
    work = reports + list(reversed(reports))
    # WHEN they ingest at once
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda r: store.ingest(factory, r), work))
    # THEN each report is stored exactly once, and each repeat is recognised
    assert sum(r.status == "created" for r in results) == 60
    assert sum(r.status == "exists" for r in results) == 60
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(Report)) == 60
        assert s.scalar(select(func.count()).select_from(Run)) == 30
    engine.dispose()


def test_api_round_trip_on_both_backends(db_url: str) -> None:
    app = create_app(Settings(database_url=db_url, write_token=TOKEN))  # type: ignore[arg-type]
    with TestClient(app) as c:
        for rep in demo_reports():
            r = c.post(
                "/api/v1/reports",
                content=rep.model_dump_json(),
                headers={**AUTH, "Content-Type": "application/json"},
            )
            assert r.status_code == 201
        assert c.get("/api/v1/models").json()["count"] == 2
        runs = c.get("/api/v1/runs", params={"since": "2026-01-01T00:30:00+00:00"}).json()
        assert runs["count"] == 3
        cmp = c.get(
            "/api/v1/compare",
            params={
                "a": "demo-minimax-m3-eagle3-k3-main",
                "b": "demo-minimax-m3-eagle3-k3-pr",
            },
        ).json()
        assert round(cmp["kv_ratio"], 2) == 0.94
        stored = c.get("/api/v1/reports/demo-minimax-m3-eagle3-k3-pr-rank0").json()
        assert RunReport.model_validate(stored) == demo_report("minimax-m3-eagle3-k3", "PR")


def test_reads_and_healthz_answer_while_a_writer_waits_for_the_sqlite_lock(
    live_server: str, sqlite_url: str
) -> None:
    """Storing runs off the event loop: a writer queued behind another process's write lock must
    not stop the server from answering everything else."""
    body = demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json()
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    outcome: list[int] = []
    headers = {"Content-Type": "application/json", **AUTH}

    def post() -> None:
        r = httpx.post(live_server + "/api/v1/reports", content=body, headers=headers, timeout=60)
        outcome.append(r.status_code)

    writer = threading.Thread(target=post)
    writer.start()
    time.sleep(0.5)  # lets the POST reach the server and queue on the lock (not a timed check)
    try:
        health = httpx.get(live_server + "/healthz", timeout=60)
        models = httpx.get(live_server + "/api/v1/models", timeout=60)
        # Both answered while the write was still waiting for the lock.
        assert (health.status_code, models.status_code) == (200, 200)
        assert writer.is_alive() and outcome == []
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        writer.join(timeout=60)
    assert outcome == [201]


def test_a_report_stored_under_its_path_before_is_already_stored_when_sent_again(
    db_url: str,
) -> None:
    """Rows stored before ingest shortened path-like models: sending the same report again (a
    spool re-delivered, a second rank of that launch) is a repeat or a new rank, never a 409."""
    data = json.loads(_variant(900).model_dump_json())
    data["model"] = "/models/llama8b"
    old = RunReport.model_validate(data)
    app = create_app(Settings(database_url=db_url, write_token=TOKEN))  # type: ignore[arg-type]
    with TestClient(app) as c:
        # store.ingest is what the service called before the stored form: the path as sent.
        assert store.ingest(app.state.sessionmaker, old).status == "created"
        again = c.post(
            "/api/v1/reports",
            content=old.model_dump_json(),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        assert again.status_code == 200, again.text
        rank1 = json.loads(old.model_dump_json())
        rank1.update(report_id="w-900-r1", rank=1)
        other = c.post("/api/v1/reports", json=rank1, headers=AUTH)
        assert other.status_code == 201, other.text


def test_deleting_a_run_row_deletes_its_reports_at_the_database(db_url: str) -> None:
    """ON DELETE CASCADE (migration 0003): a run deleted by plain SQL takes its reports along."""
    engine = db.make_engine(db_url)
    try:
        db.upgrade(engine)
        factory = db.make_sessionmaker(engine)
        store.ingest(factory, _variant(1, rank=0))
        store.ingest(factory, _variant(1, rank=1))
        store.ingest(factory, _variant(2))
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM runs WHERE run_id = 'w-1'"))
        with engine.connect() as conn:
            left = conn.execute(text("SELECT report_id FROM reports ORDER BY report_id")).all()
        assert [r[0] for r in left] == ["w-2-r0"]
    finally:
        engine.dispose()

"""Ingest's CPU work in worker processes (MEMEST_INGEST_PROCESSES) answers exactly as in the
server's threads (0): the same statuses, bodies and stored rows."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from memest.demo import demo_report
from memest.service.config import Settings
from memest.service.errors import BadRequest, Conflict, ServiceError, TooManyRequests
from memest.service.ingest import IngestPool, prepare_body
from tests.integration.service.conftest import AUTH, MakeClient

JSON = {"Content-Type": "application/json", **AUTH}


def _body(**changes: object) -> bytes:
    data = json.loads(demo_report("minimax-m3-eagle3-k3", "PR").model_dump_json())
    data.update({"report_id": "r-1", "run_id": "run-1", "source": "synthetic", "world_size": 1})
    data.update(changes)
    return json.dumps(data).encode()


def _exchange(make_client: MakeClient, url: str, processes: int) -> list[tuple[int, object]]:
    client = make_client(database_url=url, ingest_processes=processes)
    deep: object = 1
    for _ in range(70):
        deep = [deep]
    bodies = [
        _body(),  # stored
        _body(),  # the same again: exists
        _body(world_size=2),  # same report id, other content
        _body(report_id="r-2", rank=1),  # rank 1 of run-1 (world size 1): refused
        _body(report_id="r-3", world_size=2, rank=1),  # run-1 is stored with world size 1
        _body(report_id="r-4", run_id=5),  # wrong type
        json.dumps({"report_id": "r-5", "deep": deep}).encode(),
        b"{not json",
        _body(report_id="r-6", run_id="run-2"),  # stored
    ]
    answers = []
    for body in bodies:
        response = client.post("/api/v1/reports", content=body, headers=JSON)
        answers.append((response.status_code, response.json()))
    runs = client.get("/api/v1/runs").json()
    answers.append((runs["count"], sorted(r["run_id"] for r in runs["data"])))
    metrics = client.get("/metrics").text
    counters = sorted(ln for ln in metrics.splitlines() if ln.startswith("memest_ingest_"))
    answers.append((0, [ln for ln in counters if "_total" in ln]))
    return answers


def test_worker_processes_answer_as_the_servers_threads(
    make_client: MakeClient, tmp_path: Path, db_url: str
) -> None:
    """Workers on each backend answer as threads (MEMEST_INGEST_PROCESSES=0) on SQLite."""
    in_threads = _exchange(make_client, f"sqlite:///{tmp_path / 'threads.db'}", 0)
    in_workers = _exchange(make_client, db_url, 2)
    assert in_workers == in_threads
    statuses = [status for status, _ in in_threads[:9]]
    assert statuses == [201, 200, 409, 422, 409, 422, 422, 422, 201]
    assert in_threads[2][1]["field"] == "report_id"  # type: ignore[index]
    assert in_threads[4][1]["field"] == "world_size"  # type: ignore[index]
    assert in_threads[5][1]["field"] == "run_id"  # type: ignore[index]
    assert in_threads[9] == (2, ["run-1", "run-2"])
    assert 'memest_ingest_reports_total{outcome="rejected"} 6.0' in in_threads[10][1]  # type: ignore[operator]


def test_a_pool_prepares_what_the_thread_prepares() -> None:
    pool = IngestPool(1)
    try:
        assert pool.prepare(_body()) == prepare_body(_body())
        with pytest.raises(BadRequest) as in_worker:
            pool.prepare(_body(rank=3))
    finally:
        pool.shutdown()
    with pytest.raises(BadRequest) as in_thread:
        prepare_body(_body(rank=3))
    assert (in_worker.value.message, in_worker.value.field) == (
        in_thread.value.message,
        in_thread.value.field,
    )
    assert "rank 3 is not below world_size 1" in in_worker.value.message


@pytest.mark.parametrize(
    "error",
    [
        BadRequest("bad", field="rank"),
        Conflict("taken", field="report_id"),
        ServiceError("plain"),
        TooManyRequests("wait", retry_after_s=7),
    ],
)
def test_a_service_error_pickles_whole(error: ServiceError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert (back.message, back.field, back.status_code, str(back)) == (
        error.message,
        error.field,
        error.status_code,
        str(error),
    )
    assert getattr(back, "retry_after_s", None) == getattr(error, "retry_after_s", None)


@pytest.mark.parametrize("value", ["-1", "two", "1.5", "65"])
def test_a_bad_ingest_processes_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MEMEST_INGEST_PROCESSES", value)
    with pytest.raises(ValidationError, match="ingest_processes"):
        Settings()


def test_ingest_processes_0_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEST_INGEST_PROCESSES", "0")
    assert Settings().ingest_processes == 0

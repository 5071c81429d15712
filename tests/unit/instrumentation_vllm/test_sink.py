from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from memest_instrumentation.vllm import sink
from memest_instrumentation.vllm.env import Settings

from memest.schema import RunConfig, RunReport


def _report() -> RunReport:
    return RunReport(run_id="r1", rank=1, world_size=2, model="m", config=RunConfig(model="m"))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


@pytest.fixture()
def server() -> Iterator[tuple[str, list[tuple[str, dict[str, str], bytes]], list[int]]]:
    seen: list[tuple[str, dict[str, str], bytes]] = []
    statuses: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, dict(self.headers), body))
            status = statuses.pop(0) if statuses else 201
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, statuses
    httpd.shutdown()


def test_report_file_is_per_run_and_rank(tmp_path: Path) -> None:
    path = sink.write_report(Settings(output_dir=str(tmp_path)), _report())
    assert path == tmp_path / "r1" / "report.rank1.json"
    assert RunReport.model_validate_json(path.read_text()).rank == 1


def test_push_posts_json_with_bearer_token(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, seen, statuses = server
    statuses.extend([503])  # one transient failure, then accepted
    clock = _Clock()
    s = Settings(service_url=url, token="tok", output_dir=str(tmp_path), push_retries=3)
    ok, problems = sink.push(s, _report(), sleep=clock.sleep, clock=clock)
    assert ok and problems == ["attempt 1: HTTP 503"]
    path, headers, body = seen[-1]
    assert path == "/api/v1/reports"
    assert headers["Authorization"] == "Bearer tok"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["run_id"] == "r1"
    assert clock.sleeps == [0.5]
    assert not (tmp_path / "spool").exists()


def test_refused_report_is_not_retried_and_is_spooled(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, seen, statuses = server
    statuses.extend([422, 422, 422])
    s = Settings(service_url=url, output_dir=str(tmp_path), push_retries=3)
    clock = _Clock()
    ok, problems = sink.push(s, _report(), sleep=clock.sleep, clock=clock)
    assert not ok and len(seen) == 1
    assert problems[0] == "attempt 1: HTTP 422"
    assert (tmp_path / "spool" / "r1.rank1.json").exists()


def test_unreachable_service_backs_off_then_spools_within_the_deadline(tmp_path: Path) -> None:
    s = Settings(
        service_url="http://127.0.0.1:9",
        output_dir=str(tmp_path),
        push_retries=4,
        push_timeout_s=1.0,
    )
    clock = _Clock()
    ok, problems = sink.push(s, _report(), sleep=clock.sleep, clock=clock)
    assert not ok
    assert sum(clock.sleeps) <= 1.0  # never waits past MEMEST_PUSH_TIMEOUT_S
    assert clock.sleeps[:1] == [0.5]
    assert problems[-1].startswith("spooled to ")
    spooled = tmp_path / "spool" / "r1.rank1.json"
    assert RunReport.model_validate_json(spooled.read_text()).run_id == "r1"


def test_no_service_no_push(tmp_path: Path) -> None:
    assert sink.push(Settings(output_dir=str(tmp_path)), _report()) == (False, [])


def _spool_reports(s: Settings, count: int) -> list[Path]:
    return [
        sink.spool(s, RunReport(run_id=f"old{i}", model="m", config=RunConfig(model="m")))
        for i in range(count)
    ]


def test_rank_0_delivers_the_spool_of_earlier_starts_and_removes_it(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, seen, _ = server
    s = Settings(service_url=url, output_dir=str(tmp_path))
    spooled = _spool_reports(s, 2)
    (tmp_path / "spool" / "notes.json").write_text("not a report")
    rank0 = _report().model_copy(update={"rank": 0})
    ok, _ = sink.push(s, rank0, clock=_Clock())
    assert ok
    assert sorted(json.loads(body)["run_id"] for _, _, body in seen) == ["old0", "old1", "r1"]
    assert not any(p.exists() for p in spooled)
    assert (tmp_path / "spool" / "notes.json").exists()  # not a report: kept, never sent


def test_other_ranks_leave_the_spool_alone(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, seen, _ = server
    s = Settings(service_url=url, output_dir=str(tmp_path))
    spooled = _spool_reports(s, 1)
    assert sink.push(s, _report(), clock=_Clock())[0]  # rank 1
    assert len(seen) == 1 and spooled[0].exists()


def test_spool_delivery_is_bounded_in_count(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, seen, _ = server
    s = Settings(service_url=url, output_dir=str(tmp_path))
    _spool_reports(s, sink.SPOOL_BATCH_FILES + 3)
    lines = sink.deliver_spool(s, clock=_Clock())
    assert len(seen) == sink.SPOOL_BATCH_FILES
    assert lines == [
        f"spooled reports: {sink.SPOOL_BATCH_FILES} sent, 0 already stored, "
        "0 skipped, 0 failed, 3 left for later"
    ]
    assert len(list((tmp_path / "spool").glob("*.json"))) == 3


def test_spool_delivery_is_bounded_in_time(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, seen, _ = server
    s = Settings(service_url=url, output_dir=str(tmp_path), push_timeout_s=10.0)
    _spool_reports(s, 3)

    class SlowClock(_Clock):
        def __call__(self) -> float:
            self.now += 6.0  # every file appears to take 6 s
            return self.now

    lines = sink.deliver_spool(s, clock=SlowClock())
    assert len(seen) == 1 and lines[0].endswith("2 left for later")


def test_spool_delivery_fails_open(tmp_path: Path) -> None:
    s = Settings(service_url="http://127.0.0.1:9", output_dir=str(tmp_path), push_timeout_s=1.0)
    spooled = _spool_reports(s, 1)
    lines = sink.deliver_spool(s)
    assert lines[0] == "spooled reports: 0 sent, 0 already stored, 0 skipped, 1 failed"
    assert spooled[0].exists()
    blocked = Settings(service_url="http://127.0.0.1:9", output_dir=str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the output folder should be")
    assert sink.deliver_spool(blocked) == []

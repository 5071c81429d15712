"""The plugin's report file, push and spool (against local servers on 127.0.0.1)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from memest_instrumentation.vllm import sink
from memest_instrumentation.vllm.env import Settings

from memest.errors import ConfigError
from memest.schema import RunConfig, RunReport
from tests.push_servers import (
    Log,
    LoginPage,
    OtherReportAck,
    ServiceDouble,
    Trickle,
    redirect_to,
    serve,
)


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
def server() -> Iterator[tuple[str, Log]]:
    with serve(ServiceDouble) as running:
        yield running


def test_report_file_is_per_run_and_rank(tmp_path: Path) -> None:
    path = sink.write_report(Settings(output_dir=str(tmp_path)), _report())
    assert path == tmp_path / "r1" / "report.rank1.json"
    assert RunReport.model_validate_json(path.read_text()).rank == 1


def test_push_posts_json_with_bearer_token(server: tuple[str, Log], tmp_path: Path) -> None:
    url, log = server
    log.statuses.extend([503])  # one transient failure, then accepted
    clock = _Clock()
    s = Settings(service_url=url, token="tok", output_dir=str(tmp_path), push_retries=3)
    ok, problems = sink.push(s, _report(), sleep=clock.sleep, clock=clock)
    assert ok and problems == ["attempt 1: HTTP 503: refused (field: model)"]
    last = log.requests[-1]
    assert last.path == "/api/v1/reports"
    assert last.headers["Authorization"] == "Bearer tok"
    assert last.headers["Content-Type"] == "application/json"
    assert last.json["run_id"] == "r1"
    assert clock.sleeps == [0.5]
    assert not (tmp_path / "spool").exists()


def test_refused_report_is_not_retried_and_is_set_aside(
    server: tuple[str, Log], tmp_path: Path
) -> None:
    url, log = server
    log.statuses.extend([422, 422, 422])
    s = Settings(service_url=url, output_dir=str(tmp_path), push_retries=3)
    clock = _Clock()
    ok, problems = sink.push(s, _report(), sleep=clock.sleep, clock=clock)
    assert not ok and len(log.requests) == 1
    assert problems[0] == "attempt 1: HTTP 422: refused (field: model)"
    kept = tmp_path / "rejected" / "r1.rank1.json"
    assert problems[-1] == f"refused by the service; kept in {kept}"
    assert RunReport.model_validate_json(kept.read_text()).run_id == "r1"
    reason = (tmp_path / "rejected" / "r1.rank1.json.reason.txt").read_text()
    assert "HTTP 422" in reason
    assert not (tmp_path / "spool").exists()  # never retried by a later start


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_credentials_or_url_problem_keeps_the_report_in_the_spool(
    server: tuple[str, Log], tmp_path: Path, status: int
) -> None:
    url, log = server
    log.statuses.append(status)
    s = Settings(service_url=url, output_dir=str(tmp_path))
    ok, problems = sink.push(s, _report(), clock=_Clock())
    assert not ok and len(log.requests) == 1
    assert problems[-1].startswith("spooled to ")
    assert (tmp_path / "spool" / "r1.rank1.json").exists()
    assert not (tmp_path / "rejected").exists()


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


def test_rank_0_delivers_the_spool_of_earlier_starts_and_removes_it(
    server: tuple[str, Log], tmp_path: Path
) -> None:
    url, log = server
    s = Settings(service_url=url, output_dir=str(tmp_path))
    spooled = _spool_reports(s, 2)
    (tmp_path / "spool" / "notes.json").write_text("not a report")
    rank0 = _report().model_copy(update={"rank": 0})
    ok, _ = sink.push(s, rank0, clock=_Clock())
    assert ok
    assert sorted(r.json["run_id"] for r in log.requests) == ["old0", "old1", "r1"]
    assert not any(p.exists() for p in spooled)
    assert (tmp_path / "spool" / "notes.json").exists()  # not a report: kept, never sent


def test_other_ranks_leave_the_spool_alone(server: tuple[str, Log], tmp_path: Path) -> None:
    url, log = server
    s = Settings(service_url=url, output_dir=str(tmp_path))
    spooled = _spool_reports(s, 1)
    assert sink.push(s, _report(), clock=_Clock())[0]  # rank 1
    assert len(log.requests) == 1 and spooled[0].exists()


def test_spool_delivery_is_bounded_in_count(server: tuple[str, Log], tmp_path: Path) -> None:
    url, log = server
    s = Settings(service_url=url, output_dir=str(tmp_path))
    _spool_reports(s, sink.SPOOL_BATCH_FILES + 3)
    lines = sink.deliver_spool(s, clock=_Clock())
    assert len(log.requests) == sink.SPOOL_BATCH_FILES
    assert lines == [
        f"spooled reports: {sink.SPOOL_BATCH_FILES} sent, 0 already stored, "
        "0 skipped, 0 failed, 3 left for later"
    ]
    assert len(list((tmp_path / "spool").glob("*.json"))) == 3


def test_spool_delivery_is_bounded_in_time(server: tuple[str, Log], tmp_path: Path) -> None:
    url, log = server
    s = Settings(service_url=url, output_dir=str(tmp_path), push_timeout_s=10.0)
    _spool_reports(s, 3)

    def clock() -> float:
        return 6.0 * len(log.requests)  # every file takes 6 s

    lines = sink.deliver_spool(s, clock=clock)
    # deadline 10 s: the first file starts at 0 s, the second at 6 s with 4 s left, none at 12 s
    assert len(log.requests) == 2 and lines[0].endswith("1 left for later")


def test_spool_delivery_fails_open(tmp_path: Path) -> None:
    s = Settings(service_url="http://127.0.0.1:9", output_dir=str(tmp_path), push_timeout_s=1.0)
    spooled = _spool_reports(s, 1)
    lines = sink.deliver_spool(s)
    assert lines[0] == "spooled reports: 0 sent, 0 already stored, 0 skipped, 1 failed"
    assert spooled[0].exists()
    blocked = Settings(service_url="http://127.0.0.1:9", output_dir=str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the output folder should be")
    assert sink.deliver_spool(blocked) == []


def _timed_push(url: str, tmp_path: Path, timeout_s: float) -> tuple[float, bool, list[str]]:
    s = Settings(
        service_url=url, output_dir=str(tmp_path), push_timeout_s=timeout_s, push_retries=3
    )
    started = time.monotonic()
    ok, problems = sink.push(s, _report())
    return time.monotonic() - started, ok, problems


def test_a_server_trickling_its_answer_is_cut_off_at_the_push_deadline(tmp_path: Path) -> None:
    """1 byte/s never trips a per-read timeout; the push still ends at MEMEST_PUSH_TIMEOUT_S."""
    with serve(Trickle) as (url, log):
        elapsed, ok, problems = _timed_push(url, tmp_path, timeout_s=2.0)
    assert not ok and log.requests  # it did reach the server
    assert elapsed < 2.0 + 1.0, elapsed
    assert any("TimeoutError" in p for p in problems), problems
    assert problems[-1] == f"spooled to {tmp_path / 'spool' / 'r1.rank1.json'}"


def test_spool_delivery_stops_at_the_deadline_of_the_push(tmp_path: Path) -> None:
    with serve(Trickle) as (url, _):
        s = Settings(service_url=url, output_dir=str(tmp_path), push_timeout_s=1.5)
        spooled = _spool_reports(s, 3)
        started = time.monotonic()
        lines = sink.deliver_spool(s)
        elapsed = time.monotonic() - started
    assert elapsed < 1.5 + 1.0, elapsed
    assert (
        lines[0]
        == "spooled reports: 0 sent, 0 already stored, 0 skipped, 1 failed, 2 left for later"
    )
    assert all(p.exists() for p in spooled)


def test_a_redirect_is_not_followed_and_the_token_stays_home(tmp_path: Path) -> None:
    with serve(ServiceDouble) as (elsewhere, other_log):
        with serve(redirect_to(elsewhere + "/api/v1/reports")) as (url, log):
            s = Settings(service_url=url, token="secret", output_dir=str(tmp_path))
            ok, problems = sink.push(s, _report(), clock=_Clock())
    assert not ok
    assert len(log.requests) == 1  # a redirect is final: no retry
    assert other_log.requests == []  # nothing, so no token, reached the redirect's host
    assert "HTTP 302" in problems[0] and "not followed" in problems[0]
    assert (tmp_path / "spool" / "r1.rank1.json").exists()


@pytest.mark.parametrize("handler", [LoginPage, OtherReportAck])
def test_a_2xx_that_is_not_the_services_acknowledgement_keeps_the_report(
    tmp_path: Path, handler: type
) -> None:
    with serve(handler) as (url, log):
        s = Settings(service_url=url, output_dir=str(tmp_path))
        ok, problems = sink.push(s, _report(), clock=_Clock())
        spooled = _spool_reports(s, 1)
        lines = sink.deliver_spool(s, clock=_Clock())
    assert not ok and "not the memest service's acknowledgement" in problems[0]
    assert (tmp_path / "spool" / "r1.rank1.json").exists()
    assert lines[0] == "spooled reports: 0 sent, 0 already stored, 0 skipped, 2 failed"
    assert spooled[0].exists()


def test_refused_spool_files_move_to_rejected_and_stop_blocking_the_spool(tmp_path: Path) -> None:
    """More refused reports than one start sends must not hold the spool up for good."""
    log = Log(statuses=[422] * (sink.SPOOL_BATCH_FILES + 2))
    with serve(ServiceDouble, log) as (url, _):
        s = Settings(service_url=url, output_dir=str(tmp_path))
        refused = _spool_reports(s, sink.SPOOL_BATCH_FILES + 2)
        first = sink.deliver_spool(s, clock=_Clock())
        good = sink.spool(s, RunReport(run_id="zz-good", model="m", config=RunConfig(model="m")))
        second = sink.deliver_spool(s, clock=_Clock())
    batch = sink.SPOOL_BATCH_FILES
    assert first[0] == (
        "spooled reports: 0 sent, 0 already stored, 0 skipped, "
        f"{batch} failed ({batch} moved to rejected/), 2 left for later"
    )
    assert second[0] == (
        "spooled reports: 1 sent, 0 already stored, 0 skipped, 2 failed (2 moved to rejected/)"
    )
    assert not good.exists()
    rejected = tmp_path / "rejected"
    for path in refused:
        assert not path.exists()
        assert (rejected / path.name).exists()
        assert "HTTP 422" in (rejected / f"{path.name}.reason.txt").read_text()
    assert list((tmp_path / "spool").iterdir()) == []


def test_a_lone_surrogate_is_replaced_in_the_file_and_the_push(
    server: tuple[str, Log], tmp_path: Path
) -> None:
    url, log = server
    odd = _report().model_copy(update={"model": "caf\udce9"})  # a surrogateescape'd byte
    s = Settings(service_url=url, output_dir=str(tmp_path))
    path = sink.write_report(s, odd)
    assert RunReport.model_validate_json(path.read_bytes()).model == "caf\ufffd"
    ok, _ = sink.push(s, odd, clock=_Clock())
    assert ok and log.requests[0].json["model"] == "caf\ufffd"


@pytest.mark.parametrize("run_id", ["../../x", "/abs", "a/b", ".hidden", ""])
def test_no_file_is_written_for_a_run_id_that_is_not_a_folder_name(
    tmp_path: Path, run_id: str
) -> None:
    out = tmp_path / "out"
    s = Settings(output_dir=str(out))
    report = _report().model_copy(update={"run_id": run_id})
    with pytest.raises(ConfigError, match="run_id"):
        sink.write_report(s, report)
    with pytest.raises(ConfigError, match="run_id"):
        sink.spool(s, report)
    assert list(tmp_path.rglob("*")) == []


def test_a_refused_spool_file_that_cannot_be_moved_stays_in_the_spool(tmp_path: Path) -> None:
    log = Log(statuses=[422])
    with serve(ServiceDouble, log) as (url, _):
        s = Settings(service_url=url, output_dir=str(tmp_path))
        (spooled,) = _spool_reports(s, 1)
        (tmp_path / "rejected").write_text("a file where the rejected folder should be")
        lines = sink.deliver_spool(s, clock=_Clock())
    assert lines[0] == "spooled reports: 0 sent, 0 already stored, 0 skipped, 1 failed"
    assert "not moved to" in lines[1]
    assert spooled.exists()

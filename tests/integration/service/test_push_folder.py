"""``memest push DIR`` and ``memest push --spool DIR`` against a live service: every file is
tried, non-reports are skipped and named, delivered spool files are removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from memest.cli import main
from memest.demo import demo_report
from tests.integration.service.conftest import TOKEN

SLUGS = ("deepseek-v4-flash-dspark-k7", "minimax-m3-eagle3-k3")


def _reports(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for slug in SLUGS:
        for build in ("main", "PR"):
            path = folder / f"{slug}-{build}.json"
            path.write_text(demo_report(slug, build).model_dump_json())
            paths.append(path)
    return paths


def _junk(folder: Path) -> list[Path]:
    """Files a folder of reports may also hold; each must be skipped, not stop the push."""
    not_utf8 = folder / "a-latin1.json"
    not_utf8.write_bytes(b'{"model": "caf\xe9"}')
    not_report = folder / "b-notes.json"
    not_report.write_text('{"note": "not a report"}')
    device = folder / "c-zero.json"
    device.symlink_to("/dev/zero")
    return [not_utf8, not_report, device]


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out.strip().splitlines()


def test_push_folder_skips_non_reports_and_sends_the_rest(
    tmp_path: Path, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    reports = _reports(folder / "nested")
    junk = _junk(folder)
    args = ["push", str(folder), "--url", live_server, "--token", TOKEN, "--retries", "0"]
    assert main(args) == 0
    lines = _lines(capsys)
    assert lines[-1] == "4 sent, 0 already stored, 3 skipped, 0 failed"
    for path in junk:
        (line,) = [x for x in lines if x.startswith(f"{path}:")]
        assert "skipped, not a valid report" in line
    assert "not UTF-8" in "\n".join(lines) and "not a regular file" in "\n".join(lines)
    assert sum(": created (" in x for x in lines) == len(reports)
    assert main(args) == 0
    assert _lines(capsys)[-1] == "0 sent, 4 already stored, 3 skipped, 0 failed"
    assert all(p.exists() for p in reports)  # a plain push keeps its files


def test_push_folder_counts_failures_and_exits_1(
    tmp_path: Path, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    _reports(folder)
    _junk(folder)
    args = ["push", str(folder), "--url", live_server, "--token", "wrong", "--retries", "0"]
    assert main(args) == 1
    lines = _lines(capsys)
    assert lines[-1] == "0 sent, 0 already stored, 3 skipped, 4 failed"
    assert sum("HTTP 401" in x for x in lines) == 4


def test_push_spool_removes_delivered_reports_only(
    tmp_path: Path, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "memest-out" / "spool"
    reports = _reports(spool)
    junk = _junk(spool)
    base = ["--url", live_server, "--token", TOKEN, "--retries", "0"]
    stored_before = reports[0]
    assert main(["push", str(stored_before), *base]) == 0  # one was delivered already
    capsys.readouterr()
    assert main(["push", "--spool", str(spool), *base]) == 0
    assert _lines(capsys)[-1] == "3 sent, 1 already stored, 3 skipped, 0 failed"
    assert not any(p.exists() for p in reports)
    assert all(p.exists() or p.is_symlink() for p in junk)


def test_push_spool_keeps_reports_the_service_refused(
    tmp_path: Path, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    reports = _reports(spool)
    args = ["push", "--spool", str(spool), "--url", live_server, "--token", "x", "--retries", "0"]
    assert main(args) == 1
    assert _lines(capsys)[-1] == "0 sent, 0 already stored, 0 skipped, 4 failed"
    assert all(p.exists() for p in reports)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["push", "--spool", "/nonexistent-spool"], "not a folder"),
        (["push"], "--spool DIR"),
    ],
)
def test_push_bad_arguments(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err


def test_push_missing_file_is_named_and_the_others_still_sent(
    tmp_path: Path, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = _reports(tmp_path / "given")
    missing = tmp_path / "missing.json"
    args = ["push", str(missing), *map(str, reports), "--url", live_server, "--token", TOKEN]
    code = main(args)
    lines = _lines(capsys)
    assert code == 1  # a named file is missing, though every real one was tried
    assert any(line.startswith(f"{missing}: skipped") and "No such file" in line for line in lines)
    stored = [x for x in lines if ": created (" in x or ": exists (" in x]
    assert len(stored) == len(reports)
    assert lines[-1].endswith("1 skipped, 0 failed")


@pytest.mark.parametrize("url", ["notaurl", "ftp://host/", "http://:80", "http://h:99999"])
def test_push_refuses_a_url_that_is_not_http_in_one_line(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = _reports(tmp_path)
    assert main(["push", str(reports[0]), "--url", url, "--retries", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was tried
    assert captured.err.count("\n") == 1 and "http(s)://HOST" in captured.err


def test_two_starts_under_one_run_id_are_both_stored_and_a_repush_is_already_stored(
    tmp_path: Path, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Launches that reuse one MEMEST_RUN_ID: the second start gets a fresh run id (the first
    one's plus its report id's first characters), and pushing both again answers "already
    stored" for each, never 409."""
    first = demo_report(SLUGS[0], "main").model_copy(
        update={"run_id": "reused-run-id", "world_size": 1, "rank": 0}
    )
    second = first.model_copy(update={"report_id": "0123456789abcdef" * 2})
    folder = tmp_path / "starts"
    folder.mkdir()
    (folder / "1.json").write_text(first.model_dump_json())
    (folder / "2.json").write_text(second.model_dump_json())
    args = ["push", str(folder), "--url", live_server, "--token", TOKEN, "--retries", "0"]
    assert main(args) == 0
    lines = _lines(capsys)
    assert lines[-1] == "2 sent, 0 already stored, 0 skipped, 0 failed"
    assert any("2.json: created as run reused-run-id.01234567 " in x for x in lines), lines
    assert main(args) == 0
    lines = _lines(capsys)
    assert lines[-1] == "0 sent, 2 already stored, 0 skipped, 0 failed"
    assert any("2.json: already stored as run reused-run-id.01234567 " in x for x in lines)

"""`memest push` never hangs on a slow server, never follows a redirect, counts only the service's
acknowledgement as stored, sets refused spool files aside and never prints a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memest.cli import main
from memest.demo import demo_report
from tests.integration.service.conftest import TOKEN
from tests.push_servers import LoginPage, ServiceDouble, Trickle, redirect_to, serve

ROOT = Path(__file__).resolve().parents[3]


def _report_file(folder: Path, name: str = "a.json", model: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    report = demo_report("minimax-m3-eagle3-k3", "main")
    if model is not None:
        report = report.model_copy(update={"model": model})
    path = folder / name
    # json.dumps escapes a lone surrogate as \udce9, as a report file written in Python may hold
    path.write_text(json.dumps(report.model_dump(mode="json")))
    return path


def _push(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m memest push ...` in a child process: its stdout is a real UTF-8 stream."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'instrumentation'}"}
    env.pop("MEMEST_WRITE_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "memest", "push", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_a_trickling_server_is_cut_off_at_the_timeout(tmp_path: Path) -> None:
    path = _report_file(tmp_path)
    with serve(Trickle) as (url, log):
        started = time.monotonic()
        code = main(["push", str(path), "--url", url, "--retries", "0", "--timeout", "1.5"])
        elapsed = time.monotonic() - started
    assert code == 1 and log.requests
    assert elapsed < 1.5 + 1.0, elapsed


def test_a_redirect_is_a_failure_and_the_token_never_leaves_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _report_file(tmp_path)
    with serve(ServiceDouble) as (elsewhere, other_log):
        with serve(redirect_to(elsewhere + "/api/v1/reports")) as (url, log):
            code = main(["push", str(path), "--url", url, "--token", "secret", "--retries", "3"])
    out = capsys.readouterr().out
    assert code == 1 and "HTTP 302" in out and "not followed" in out
    assert len(log.requests) == 1 and log.requests[0].headers["Authorization"] == "Bearer secret"
    assert other_log.requests == []


def test_a_login_page_is_not_a_stored_report_and_the_spool_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "out" / "spool"
    path = _report_file(spool)
    with serve(LoginPage) as (url, _):
        code = main(["push", "--spool", str(spool), "--url", url, "--retries", "0"])
    out = capsys.readouterr().out
    assert code == 1
    assert "HTTP 200 (text/html) is not the memest service's acknowledgement" in out
    assert out.strip().splitlines()[-1] == "0 sent, 0 already stored, 0 skipped, 1 failed"
    assert path.exists()


def test_spool_files_the_service_refuses_move_to_rejected(
    tmp_path: Path, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report id stored with other content is a 409 for good: set aside, not retried forever."""
    stored = _report_file(tmp_path / "given")
    base = ["--url", live_server, "--token", TOKEN, "--retries", "0"]
    assert main(["push", str(stored), *base]) == 0
    spool = tmp_path / "out" / "spool"
    changed = _report_file(spool, "changed.json", model="another-model")
    fresh = spool / "fresh.json"
    fresh.write_text(demo_report("deepseek-v4-flash-dspark-k7", "main").model_dump_json())
    capsys.readouterr()
    assert main(["push", "--spool", str(spool), *base]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "1 sent, 0 already stored, 0 skipped, 1 failed (1 moved to rejected/)"
    rejected = tmp_path / "out" / "rejected"
    assert not changed.exists() and not fresh.exists()
    assert (rejected / "changed.json").exists()
    reason = (rejected / "changed.json.reason.txt").read_text()
    assert "HTTP 409" in reason and "different content" in reason
    assert main(["push", "--spool", str(spool), *base]) == 0  # nothing left to block the spool
    assert capsys.readouterr().out.strip() == "0 sent, 0 already stored, 0 skipped, 0 failed"


def test_a_lone_surrogate_is_one_line_never_a_traceback(tmp_path: Path) -> None:
    odd = _report_file(tmp_path, "odd.json", model="caf\udce9")
    good = _report_file(tmp_path, "good.json")
    with serve(ServiceDouble) as (url, log):
        done = _push(str(odd), str(good), "--url", url, "--retries", "0")
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(f"{odd}:")]
    assert line == (
        f"{odd}: skipped, not a valid report: "
        "field model: a lone surrogate '\\udce9' cannot be encoded as UTF-8"
    )
    assert done.stdout.splitlines()[-1] == "1 sent, 0 already stored, 1 skipped, 0 failed"
    assert done.returncode == 0 and len(log.requests) == 1


def test_a_file_name_that_is_not_utf8_is_printed_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    with open(os.fsencode(folder) + b"/caf\xe9.json", "wb") as handle:
        handle.write(b"not json")
    done = _push(str(folder), "--url", "http://127.0.0.1:9", "--retries", "0")
    assert "Traceback" not in done.stderr, done.stderr
    assert "caf\\udce9.json: skipped, not a valid report" in done.stdout
    assert done.returncode == 0


@pytest.mark.parametrize("flag", ["--timeout", "--backoff"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_timeout_or_backoff_that_is_not_finite_is_refused(
    tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _report_file(tmp_path)
    assert main(["push", str(path), "--url", "http://127.0.0.1:9", f"{flag}={value}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "must be finite numbers" in captured.err


def test_the_plugins_push_is_acknowledged_by_the_real_service(
    tmp_path: Path, live_server: str
) -> None:
    """The acknowledgement the push waits for is the one the ingest route answers."""
    from memest_instrumentation.vllm import sink
    from memest_instrumentation.vllm.env import Settings

    report = demo_report("minimax-m3-eagle3-k3", "main")
    settings = Settings(service_url=live_server, token=TOKEN, output_dir=str(tmp_path))
    assert sink.push(settings, report) == (True, [])
    assert sink.push(settings, report) == (True, [])  # "exists" is stored too
    wrong = Settings(service_url=live_server, token="wrong", output_dir=str(tmp_path))
    ok, problems = sink.push(wrong, report)
    assert not ok and problems[0].startswith("attempt 1: HTTP 401")
    assert (tmp_path / "spool").is_dir() and not (tmp_path / "rejected").exists()


def test_a_push_timeout_past_the_bound_keeps_the_default_and_still_pushes(
    tmp_path: Path, live_server: str
) -> None:
    """MEMEST_PUSH_TIMEOUT_S=9.3e9 (a deadline no clock reaches): refused by name, and the push
    runs under the default 10 s instead of being dropped."""
    from memest_instrumentation.vllm import sink
    from memest_instrumentation.vllm.env import Settings

    settings = Settings.from_env(
        {
            "MEMEST_SERVICE_URL": live_server,
            "MEMEST_TOKEN": TOKEN,
            "MEMEST_PUSH_TIMEOUT_S": "9.3e9",
            "MEMEST_OUTPUT_DIR": str(tmp_path),
        }
    )
    (problem,) = settings.problems
    assert problem.startswith("MEMEST_PUSH_TIMEOUT_S='9.3e9': expected a finite positive")
    assert settings.push_timeout_s == 10.0
    assert sink.push(settings, demo_report("minimax-m3-eagle3-k3", "main")) == (True, [])

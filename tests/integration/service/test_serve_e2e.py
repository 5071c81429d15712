"""The documented first use, as a person runs it: `memest serve` with no token prints one,
`memest push` stores a real report with it, and the API and dashboard read it back."""

from __future__ import annotations

import json
import os
import re
import selectors
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from memest.identity import model_display_name

pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[3]
REPORT = REPO / "tests/data/starts/call8.E_llama8b_eagle3k5_s96_t4096_u088.apply.report.rank0.json"
TOKEN_LINE = re.compile(r"write token \(MEMEST_WRITE_TOKEN was unset\): (\S+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _memest(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "memest", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _read_token(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The token line `memest serve` prints on stderr before it starts serving."""
    assert proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            continue
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = TOKEN_LINE.search(line)
        if found:
            return found.group(1)
    raise AssertionError(f"memest serve printed no token: {''.join(seen)[-2000:]}")


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return int(resp.status), resp.read()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    """`memest serve` on a free loopback port with SQLite in tmp_path and no write token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "instrumentation")])
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    db_url = f"sqlite:///{tmp_path / 'memest.db'}"
    proc = _memest("serve", "--port", str(port), "--database-url", db_url, env=env)
    try:
        token = _read_token(proc, timeout_s=60)
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(url + "/healthz")[0] == 200:
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield url, token, env
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_push_with_the_printed_token_then_read_it_back(
    served: tuple[str, str, dict[str, str]],
) -> None:
    url, token, env = served
    pushed = subprocess.run(
        [sys.executable, "-m", "memest", "push", str(REPORT), "--url", url, "--token", token],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    sent = json.loads(REPORT.read_text())
    assert f"stored ({sent['report_id']})" in pushed.stdout or "created" in pushed.stdout

    status, body = _get(f"{url}/api/v1/reports/{sent['report_id']}")
    stored = json.loads(body)
    assert status == 200
    # A local path is stored under its folder name; the original stays in config.model.
    assert (stored["run_id"], stored["rank"], stored["model"]) == (
        sent["run_id"],
        sent["rank"],
        model_display_name(sent["model"]),
    )
    assert stored["config"]["model"] == sent["config"]["model"]
    status, body = _get(f"{url}/api/v1/runs/{sent['run_id']}")
    assert status == 200 and json.loads(body)["run"]["ranks"] == [sent["rank"]]
    status, _ = _get(f"{url}/metrics")
    assert status == 200

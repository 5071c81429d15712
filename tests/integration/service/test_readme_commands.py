"""Every command README.md shows runs as written.

Each line of each ```bash block is run verbatim with bash from the repository root, in order, with
the project's virtualenv last on PATH, HOME and VLLM_CACHE_ROOT in a temporary folder and
MEMEST_WRITE_TOKEN set (the README says pushes take their token from it) and
MEMEST_DATABASE_URL naming a fresh PostgreSQL schema (the set-up line, which installs only the
[service] extra into a new virtualenv, serves its demo from SQLite as on a fresh machine). A line that starts a
server (`memest serve`) runs in the background until the block ends, and the next line waits until
it answers. The few lines that cannot run here are listed in NOT_RUN with the reason; a README
line that is neither run nor listed fails the test, and so does a listed line the README dropped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"

NOT_RUN = {
    "bash scripts/test.sh": "the test command itself: .ci/run runs it",
    "pip install 'dist/vllm_memest-0.1.0-py3-none-any.whl[vllm]'": "installs vLLM 0.33.0; "
    "tests/integration/test_wheel.py installs this wheel beside vLLM 0.33.0 and 0.34.0",
    "MEMEST_ENABLE=1 MEMEST_OUTPUT_DIR=/var/memest vllm serve ...": "starts vLLM: needs a GPU "
    "(lab/serve_runs.py runs it on the lent H200)",
}
SERVER_WAIT_S = 240  # the first set-up line installs the package before it serves
LINE_TIMEOUT_S = 600


def bash_lines() -> list[tuple[int, str]]:
    """(block number, command) for every command line of every ```bash block, comments dropped."""
    out: list[tuple[int, str]] = []
    block = -1
    inside = False
    for raw in README.read_text().splitlines():
        if raw.startswith("```"):
            inside = raw.strip() == "```bash" and not inside
            block += inside
            continue
        if inside and raw.strip() and not raw.lstrip().startswith("#"):
            out.append((block, _strip_comment(raw).strip()))
    return out


def _strip_comment(line: str) -> str:
    """A trailing `  # comment` outside quotes goes; `#` inside quotes or URLs stays."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and line[i - 1] == " ":
            return line[:i]
    return line


def _port(line: str) -> int:
    found = re.search(r"--port[ =](\d+)", line)
    return int(found.group(1)) if found else 8000


def _wait_healthy(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + SERVER_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"no answer on port {port} after {SERVER_WAIT_S} s")


#: The set-up line that makes a virtualenv of its own with only the [service] extra.
SETUP_VENV = "python3 -m venv .venv"


def _fresh_machine(env: dict[str, str]) -> dict[str, str]:
    """The set-up line's environment: a fresh machine names no database, so its demo is served
    from SQLite (here in the temporary HOME, not the checkout). PostgreSQL needs the [postgres]
    extra, which that line does not install: only where the checkout's .venv already had it (as
    scripts/test.sh makes it) could the line serve from the test's PostgreSQL."""
    return {**env, "MEMEST_DATABASE_URL": f"sqlite:///{env['HOME']}/memest.db"}


@pytest.fixture
def readme_env(tmp_path: Path, pg_url: str) -> Iterator[dict[str, str]]:
    env = dict(os.environ)
    # Last on PATH: `memest` is the project's, while `python3` in the set-up line stays the
    # machine's, as on a fresh machine.
    venv_bin = Path(sys.executable).parent
    env["PATH"] = f"{env.get('PATH', '')}{os.pathsep}{venv_bin}"
    env["HOME"] = str(tmp_path / "home")
    env["VLLM_CACHE_ROOT"] = str(tmp_path / "vllm-cache")
    env["MEMEST_WRITE_TOKEN"] = "readme-test-token"
    env["MEMEST_DATABASE_URL"] = pg_url  # a schema of its own on the project's PostgreSQL
    env.pop("MEMEST_READ_TOKEN", None)
    (tmp_path / "home").mkdir()
    yield env


def test_not_run_lines_are_still_in_the_readme() -> None:
    shown = {line for _, line in bash_lines()}
    assert set(NOT_RUN) <= shown, sorted(set(NOT_RUN) - shown)


@pytest.mark.postgres
def test_every_readme_command_runs_as_written(readme_env: dict[str, str]) -> None:
    servers: list[subprocess.Popen[bytes]] = []
    current_block = -1
    ran = 0
    try:
        for block, line in bash_lines():
            if block != current_block:
                _stop(servers)
                current_block = block
            if line in NOT_RUN:
                continue
            if "memest serve" in line:
                proc = subprocess.Popen(
                    ["bash", "-c", f"exec {line}" if line.startswith("memest") else line],
                    cwd=ROOT,
                    env=_fresh_machine(readme_env) if SETUP_VENV in line else readme_env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                servers.append(proc)
                _wait_healthy(_port(line), proc)
                ran += 1
                continue
            done = subprocess.run(
                ["bash", "-c", line],
                cwd=ROOT,
                env=readme_env,
                capture_output=True,
                text=True,
                timeout=LINE_TIMEOUT_S,
            )
            assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            ran += 1
    finally:
        _stop(servers)
    assert ran >= len(bash_lines()) - len(NOT_RUN)


def _stop(servers: list[subprocess.Popen[bytes]]) -> None:
    for proc in servers:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    servers.clear()

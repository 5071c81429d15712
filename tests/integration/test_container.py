"""The Dockerfile builds and its container answers /healthz.

Rootful podman with runc and host networking; no container registry is needed: the Dockerfile's
FROM image is made locally by scripts/container-base.sh (debootstrap), which this test runs first
(quick when the image exists). Skips only where podman is missing and cannot be installed;
MEMEST_REQUIRE_CONTAINER=1 turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_or_skip

pytestmark = pytest.mark.container

ROOT = Path(__file__).resolve().parents[2]
BASE_SCRIPT = ROOT / "scripts" / "container-base.sh"
BASE_IMAGE = "docker.io/library/python:3.11-slim"
TEST_IMAGE = "localhost/memest:test"
# runc: the runtime scripts/container-base.sh installs. Host network: pip reaches PyPI the host's
# way and the test reaches the service on loopback. Explicit ulimits: without them runc fails
# ("error setting rlimit type 7: operation not permitted"): podman's default nofile exceeds what
# such hosts allow.
PODMAN_FLAGS = [
    "--runtime",
    "runc",
    "--network",
    "host",
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=32768:32768",
]
SETUP_TIMEOUT_S = 900  # first run: apt-get install podman, debootstrap, pip downloads from PyPI
START_TIMEOUT_S = 120


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-3000:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def image() -> str:
    """Make the base image (if needed), check podman can run it, then build the Dockerfile."""
    if os.geteuid() != 0:
        require_or_skip(
            "MEMEST_REQUIRE_CONTAINER",
            "needs root: the base image is made with debootstrap and run by rootful podman",
        )
    if shutil.which("podman") is None and shutil.which("apt-get") is None:
        require_or_skip(
            "MEMEST_REQUIRE_CONTAINER",
            "podman is not installed and there is no apt-get to install it",
        )
    base = _run(["bash", str(BASE_SCRIPT)], SETUP_TIMEOUT_S)
    assert base.returncode == 0, _tail(base)
    probe = _run(["podman", "run", "--rm", *PODMAN_FLAGS, BASE_IMAGE, "true"], 120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no error output"])[-1]
        require_or_skip("MEMEST_REQUIRE_CONTAINER", f"podman cannot run containers here: {last}")
    build = _run(
        ["podman", "build", "--pull=never", "--format", "docker", *PODMAN_FLAGS]
        + ["--tag", TEST_IMAGE, "--file", str(ROOT / "Dockerfile"), str(ROOT)],
        SETUP_TIMEOUT_S,
    )
    assert build.returncode == 0, _tail(build)
    return TEST_IMAGE


@pytest.fixture
def service(image: str) -> Iterator[tuple[str, int]]:
    """Start the image's own ENTRYPOINT on a free port; always remove the container after."""
    port = _free_port()
    name = f"memest-test-{os.getpid()}-{port}"
    # Arguments after the image are appended to ENTRYPOINT (memest serve --host 0.0.0.0 --port
    # 8000); argparse keeps the last value, so the service binds loopback on the free port.
    # --no-healthcheck: podman schedules HEALTHCHECK through systemd timers, absent here.
    cmd = ["podman", "run", "--detach", "--name", name, "--no-healthcheck", *PODMAN_FLAGS]
    start = _run([*cmd, image, "--host", "127.0.0.1", "--port", str(port)], 120)
    try:
        assert start.returncode == 0, _tail(start)
        yield name, port
    finally:
        _run(["podman", "rm", "--force", "--time", "2", name], 60)


def _healthz(port: int) -> tuple[int, object] | None:
    """(status, body) of GET /healthz, or None while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError):
        return None


def _running(name: str) -> bool:
    state = _run(["podman", "inspect", "--format", "{{.State.Running}}", name], 60)
    return state.stdout.strip() == "true"


def _wait_for_healthz(name: str, port: int) -> tuple[int, object]:
    """Poll until the service answers; fail early, with its log, if the container stops."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        answer = _healthz(port)
        if answer is not None:
            return answer
        if not _running(name):
            pytest.fail(
                f"container exited before answering: {_tail(_run(['podman', 'logs', name], 60))}"
            )
        time.sleep(0.2)
    pytest.fail(f"no answer on /healthz within {START_TIMEOUT_S} s")


def test_container_answers_healthz(service: tuple[str, int]) -> None:
    assert _wait_for_healthz(*service) == (200, {"status": "ok"})


def test_container_runs_as_unprivileged_user(image: str) -> None:
    """The image drops root (USER memest) and keeps its SQLite database in the writable /data."""
    probe = _run(
        ["podman", "run", "--rm", *PODMAN_FLAGS, "--entrypoint", "sh", image]
        + ["-c", "id -un && test -w /data && echo writable"],
        120,
    )
    assert probe.returncode == 0, _tail(probe)
    assert probe.stdout.split() == ["memest", "writable"]

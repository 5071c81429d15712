"""memest serve's read limits, on a real uvicorn and raw sockets: a request head that stalls is
cut at the header deadline, an oversized head is refused, a body may still take its own time,
and the limits are settings parsed strictly."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from memest.cli import main
from memest.service import create_app
from memest.service.config import Settings
from memest.service.server import uvicorn_config
from tests.integration.service.conftest import TOKEN
from tests.live_server import free_port, run_server

#: Generous: a socket still open after this long was not cut by a 0.5 s head deadline.
PATIENCE_S = 30.0
HEAD_TIMEOUT_S = 0.5

Server = Callable[..., AbstractContextManager[tuple[str, int]]]


@pytest.fixture
def server(tmp_path: Path) -> Server:
    """A started server with memest serve's configuration; yields (host, port)."""

    @contextmanager
    def start(**limits: Any) -> Iterator[tuple[str, int]]:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 'memest.db'}",
            write_token=TOKEN,  # type: ignore[arg-type]
            **{"header_timeout_s": HEAD_TIMEOUT_S, **limits},
        )
        port = free_port()
        config = uvicorn_config(
            create_app(settings), settings, host="127.0.0.1", port=port, log_level="warning"
        )
        with run_server(config, start_timeout_s=15):
            yield "127.0.0.1", port

    return start


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=PATIENCE_S)


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; socket.timeout if it never does."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
CLOSE_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


def test_a_stalled_header_line_is_disconnected(server: Server) -> None:
    with server() as address, _connect(address) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: abc")
        # Without the deadline this read waits PATIENCE_S and raises socket.timeout.
        assert _read_all(sock) == b""


def test_a_silent_connection_is_disconnected(server: Server) -> None:
    with server() as address, _connect(address) as sock:
        assert _read_all(sock) == b""


def test_a_trickled_head_is_cut_before_it_completes(server: Server) -> None:
    # One byte every 50 ms would take 10 s to finish this head; the deadline is 0.5 s.
    head = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    with server() as address, _connect(address) as sock:
        with pytest.raises(OSError):  # BrokenPipe / ConnectionReset once the server has closed
            for i in range(len(head)):
                sock.send(head[i : i + 1])
                time.sleep(0.05)
            # The whole head went out: the server must then have answered, not closed.
            pytest.fail(f"the trickled head was read whole: {_read_all(sock)[:80]!r}")


def test_a_normal_request_and_a_later_keep_alive_request_work(server: Server) -> None:
    with server() as address, _connect(address) as sock:
        sock.sendall(GET_HEALTHZ)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        # Idle longer than the head deadline, shorter than keep-alive (5 s): the deadline counts
        # from the next request's first byte, so the connection is still good.
        time.sleep(3 * HEAD_TIMEOUT_S)
        sock.sendall(CLOSE_HEALTHZ)
        answer = _read_all(sock)
        assert _status(answer) == 200


def test_a_slow_body_is_the_apps_business_not_the_head_deadline(server: Server) -> None:
    body = b"token=wrong&next=%2F"
    head = (
        b"POST /login HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with server() as address, _connect(address) as sock:
        sock.sendall(head)
        time.sleep(3 * HEAD_TIMEOUT_S)
        sock.sendall(body)
        assert _status(_read_all(sock)) == 401  # the form's answer to a wrong token


@pytest.mark.parametrize("shape", ["one-long-header", "many-headers"])
def test_an_oversized_head_is_refused_not_held(server: Server, shape: str) -> None:
    if shape == "one-long-header":
        extra = b"X-Big: " + b"a" * 8192 + b"\r\n"
    else:
        extra = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 60) for i in range(200))
    with server(max_header_bytes=4096) as address, _connect(address) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n")
        except OSError:  # the server may answer and close before it has read everything
            pass
        answer = _read_all(sock)
        assert _status(answer) in (400, 431), answer[:200]


def test_past_max_connections_a_request_is_answered_503(server: Server) -> None:
    with server(max_connections=2) as address:
        with _connect(address) as idle, _connect(address) as sock:
            sock.sendall(CLOSE_HEALTHZ)
            assert _status(_read_all(sock)) == 503
            idle.close()
        with _connect(address) as sock:
            sock.sendall(CLOSE_HEALTHZ)
            assert _status(_read_all(sock)) == 200


def test_memest_serve_runs_uvicorn_with_the_limits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import uvicorn

    seen: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: seen.append(self.config))
    monkeypatch.setenv("MEMEST_MAX_CONNECTIONS", "77")
    args = ["serve", "--port", str(free_port()), "--database-url", f"sqlite:///{tmp_path}/m.db"]
    assert main([*args, "--header-timeout", "2.5", "--write-token-file", str(tmp_path / "t")]) == 0
    (config,) = seen
    assert config.http.head_timeout_s == 2.5  # type: ignore[union-attr]
    assert config.limit_concurrency == 77
    # The documented defaults (README): 16 KiB heads, 5 s keep-alive, a backlog of 2048.
    assert config.h11_max_incomplete_event_size == 16 * 1024
    assert config.timeout_keep_alive == 5
    assert config.backlog == 2048


@pytest.mark.parametrize(
    ("option", "env", "value"),
    [
        ("--header-timeout", None, "nan"),
        ("--header-timeout", None, "inf"),
        ("--header-timeout", None, "-1"),
        ("--header-timeout", None, "0"),
        ("--max-header-bytes", None, "12.5"),
        ("--max-connections", None, "0"),
        ("--keep-alive-timeout", None, "lots"),
        (None, "MEMEST_HEADER_TIMEOUT_S", "NaN"),
        (None, "MEMEST_BACKLOG", "-5"),
    ],
)
def test_bad_limits_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    option: str | None,
    env: str | None,
    value: str,
) -> None:
    args = ["serve", "--exit-after-load", "--database-url", f"sqlite:///{tmp_path}/m.db"]
    if option:
        args += [option, value]
    if env:
        monkeypatch.setenv(env, value)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("memest serve: MEMEST_"), err
    assert (option or env or "") in err

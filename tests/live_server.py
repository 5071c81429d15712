"""A real uvicorn on a free loopback port, in a thread, for tests that need a live HTTP server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve(app: Any, *, start_timeout_s: float) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1 until the block exits; yields its base URL.

    Raises:
        RuntimeError: uvicorn did not report started within ``start_timeout_s``.
    """
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    with run_server(config, start_timeout_s=start_timeout_s) as url:
        yield url


def free_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


@contextmanager
def run_server(config: Any, *, start_timeout_s: float) -> Iterator[str]:
    """Run a uvicorn ``config`` (host 127.0.0.1) until the block exits; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{config.port}"
    server.should_exit = True
    thread.join(timeout=10)

"""Slow clients against `memest serve` (a real process on 127.0.0.1): N connections each send a
partial request head and stall; how long the server holds them, and whether a normal request is
answered meanwhile.

  python benchmarks/bench_slow_clients.py                      # 600 stalled heads, defaults
  python benchmarks/bench_slow_clients.py --clients 600 --header-timeout 3

Run it from outside the repository with PYTHONPATH naming the tree to measure (`python -m memest`
would import the current directory's memest first).

Prints one JSON object: seconds from the stall until each stalled connection was closed by the
server (min, median, max; "held" counts those still open at --patience), and a normal GET
/healthz's status and latency during the stall. A benchmark, not a test: timings depend on the
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_up(port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                if s.recv(12).startswith(b"HTTP/1.1"):
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("memest serve did not start")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=600)
    p.add_argument("--header-timeout", type=float, default=None, help="passed to memest serve")
    p.add_argument("--patience", type=float, default=60.0, help="seconds to wait for closes")
    args = p.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "memest", "serve", "--port", str(port)]
        cmd += ["--database-url", f"sqlite:///{Path(tmp) / 'm.db'}"]
        cmd += ["--write-token-file", str(Path(tmp) / "token")]
        if args.header_timeout is not None:
            cmd += ["--header-timeout", str(args.header_timeout)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        log = (Path(tmp) / "serve.log").open("w")  # a file, not a pipe nobody drains
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_up(port, 60)
            result = _siege(port, args.clients, args.patience)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    result["header_timeout_s"] = args.header_timeout
    print(json.dumps(result, indent=2))
    return 0


def _siege(port: int, clients: int, patience_s: float) -> dict[str, object]:
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(clients):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Slow: ")  # and nothing more
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        socks.append(s)
    start = time.monotonic()
    # A normal client while the stalled ones are held.
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
            normal = s.recv(64).split(b" ", 2)[1].decode()
    except OSError as exc:
        normal = f"error: {exc}"
    normal_s = time.monotonic() - t0
    closed: list[float] = []
    open_ = len(socks)
    while open_ and time.monotonic() - start < patience_s:
        for key, _ in sel.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except ConnectionResetError:
                data = b""
            if not data:
                closed.append(time.monotonic() - start)
                sel.unregister(sock)
                sock.close()
                open_ -= 1
    for s in socks:
        s.close()
    return {
        "clients": clients,
        "closed": len(closed),
        "held_at_patience": open_,
        "patience_s": patience_s,
        "close_after_s": {
            "min": round(min(closed), 2) if closed else None,
            "median": round(statistics.median(closed), 2) if closed else None,
            "max": round(max(closed), 2) if closed else None,
        },
        "normal_request": {"status": normal, "seconds": round(normal_s, 3)},
    }


if __name__ == "__main__":
    sys.exit(main())

"""The calculators' worker processes: every pre-flight, what-if and estimate a request starts runs
here, never on the event loop, with a deadline per request. The dashboard's page builds run in
a second pool of this kind (MEMEST_PAGE_WORKERS, memest.service.pages), so that a flood of pages
never holds a calculator's worker, nor the reverse.

A pool of MEMEST_COMPUTE_WORKERS spawned processes, each fed through a pipe. A request waits for
a free worker and for its answer within MEMEST_COMPUTE_DEADLINE_S in all: no worker free within
half of it is a 503 (with Retry-After: the server is busy, the request may be fine); a
computation that runs past the deadline is a 504 and its worker is killed and replaced, so a request can
hold a worker (and its memory) for at most the deadline. A worker answers JSON bytes (a page
worker its HTML), so the event loop only moves bytes; its refusals come back as ServiceErrors
(which pickle whole).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from memest.service.errors import BadRequest, DeadlineExceeded, Unavailable, as_service_error
from memest.service.niceness import WORKER_NICENESS, lower_priority, serve_niced

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Share of the deadline a request may wait for a free worker: one that gets a worker with
#: less time left than that would mostly run out of it (a 504 after a long wait).
QUEUE_SHARE = 0.5
#: Seconds a killed worker gets to exit before it is left to the OS.
_JOIN_S = 2.0

# The workers' priority (memest.service.niceness, which they run first), named here too.
__all__ = ["WORKER_NICENESS", "ComputePool", "Slot", "lower_priority", "serve"]


def serve(conn: Connection) -> None:
    """A worker's loop (after memest.service.niceness.serve_niced): (function, args) in,
    ("ok", bytes) / ("refused", ServiceError) / ("failed", traceback text) out."""
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", fn(*args))
        except Exception as exc:
            refusal = as_service_error(exc)
            if refusal is None and isinstance(exc, ValueError | ArithmeticError | RecursionError):
                # Absurd dimensions overflow a figure or a pydantic bound: the input's fault.
                refusal = BadRequest(f"the input leads to no valid answer: {exc}", field="body")
            reply = (
                ("refused", refusal) if refusal is not None else ("failed", traceback.format_exc())
            )
        conn.send(reply)


class _Worker:
    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork the threaded server
        self.conn, child = ctx.Pipe()
        self.process: BaseProcess = ctx.Process(target=serve_niced, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
        """The worker's reply, or None when none came within ``timeout_s`` (blocking: called
        in a thread)."""
        self.conn.send((fn, args))
        if not self.conn.poll(max(timeout_s, 0.0)):
            return None
        return self.conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(_JOIN_S)
        self.conn.close()


class ComputePool:
    """A bounded pool of calculator workers with a per-request deadline; workers start on first
    use (an app that never computes spawns none). ``kind`` and ``workers_setting`` name the
    pool in its 503 and 504 answers."""

    def __init__(
        self,
        workers: int,
        deadline_s: float,
        *,
        kind: str = "calculator",
        workers_setting: str = "MEMEST_COMPUTE_WORKERS",
    ) -> None:
        self.workers = workers
        self.deadline_s = deadline_s
        self.kind = kind
        self.workers_setting = workers_setting
        #: Computations started in a worker (a count for tests and logs).
        self.started = 0
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots: anyio.Semaphore | None = None
        self._closed = False

    def _semaphore(self) -> anyio.Semaphore:
        # Made on first use, inside the server's event loop.
        if self._slots is None:
            self._slots = anyio.Semaphore(self.workers)
        return self._slots

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker (``fn`` a module-level function returning JSON bytes).

        Raises:
            Unavailable: no worker was free within the deadline (503, Retry-After).
            DeadlineExceeded: the computation passed the deadline (504); its worker was killed.
            ServiceError: the calculator refused the input (4xx naming the field).
        """
        async with self.slot() as slot:
            return await slot.run(fn, *args)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        """A worker's turn, held for the block: what a request does before its computation (a
        database read, a cache lookup) counts against the same deadline, and requests for a
        page that one of them is building wait here and then find it cached.

        Raises:
            Unavailable: no worker was free within half the deadline (503, Retry-After).
        """
        start = time.monotonic()
        slots = self._semaphore()
        acquired = False
        with anyio.move_on_after(self.deadline_s * QUEUE_SHARE):
            await slots.acquire()
            acquired = True
        if not acquired:
            raise Unavailable(
                f"every {self.kind} worker ({self.workers_setting}={self.workers}) stayed busy "
                f"for {self.deadline_s * QUEUE_SHARE:g} s (half of MEMEST_COMPUTE_DEADLINE_S); "
                "try again later",
                retry_after_s=max(1, math.ceil(self.deadline_s)),
            )
        try:
            yield Slot(self, start)
        finally:
            slots.release()

    def _past_deadline(self) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"the computation ran past {self.deadline_s:g} s "
            "(MEMEST_COMPUTE_DEADLINE_S) and was stopped",
            field="body" if self.kind == "calculator" else None,
        )

    async def _in_worker(self, fn: Callable[..., T], args: tuple[Any, ...], left: float) -> T:
        if left <= 0:  # the deadline passed before the computation began (a slow read)
            raise self._past_deadline()
        # Starting a process (fork and exec, its arguments pickled) is no work for the event loop.
        worker = self._take_idle()
        if worker is None:
            worker = await anyio.to_thread.run_sync(_Worker)
        self.started += 1
        reply: Any = None
        try:
            # Not cancellable: a client that goes away still frees its worker by the deadline.
            reply = await anyio.to_thread.run_sync(worker.call, fn, args, left)
        except (EOFError, OSError):
            reply = ("died", None)
        finally:
            if reply is None or reply[0] == "died":
                await anyio.to_thread.run_sync(worker.kill)
            else:
                self._give_back(worker)
        if reply is None:
            raise self._past_deadline()
        kind, value = reply
        if kind == "ok":
            result: T = value
            return result
        if kind == "refused":
            raise value
        if kind == "died":
            raise Unavailable(f"the {self.kind}'s worker process died; try again", retry_after_s=1)
        log.error("%s %s failed:\n%s", self.kind, getattr(fn, "__name__", fn), value)
        raise RuntimeError(f"{self.kind} {getattr(fn, '__name__', fn)} failed")

    def _take_idle(self) -> _Worker | None:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.is_alive():
                    return worker
                worker.conn.close()
        return None

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


class Slot:
    """A worker's turn (ComputePool.slot): its computation runs within what is left of the
    request's deadline."""

    def __init__(self, pool: ComputePool, start: float) -> None:
        self._pool = pool
        self._start = start

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker, as ComputePool.run (504 past the deadline)."""
        left = self._pool.deadline_s - (time.monotonic() - self._start)
        return await self._pool._in_worker(fn, args, left)

"""The first thing a worker process runs: it lowers its own CPU priority before it imports the
rest of memest (about half a second of CPU that would otherwise share a contended core with the
server's event loop). Importing this module imports nothing of the service."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

#: The niceness a worker process adds to its own: a computation yields a contended core to the
#: server's event loop (and /healthz) at once, instead of sharing it for a scheduler slice.
WORKER_NICENESS = 10


def lower_priority() -> None:
    """Lower this process's CPU priority by WORKER_NICENESS (calculator, page and ingest
    workers)."""
    try:
        os.nice(WORKER_NICENESS)
    except OSError:  # not permitted here: the worker runs at the server's priority
        pass


def serve_niced(conn: Connection) -> None:
    """A ComputePool worker's process: niced first, then memest.service.compute's loop."""
    lower_priority()
    from memest.service.compute import serve

    serve(conn)

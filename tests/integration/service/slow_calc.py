"""A calculator stand-in for the worker-pool tests: importing it costs nothing (a worker
process imports it to run it)."""

from __future__ import annotations

import time


def sleep_then_answer(seconds: float) -> bytes:
    time.sleep(seconds)
    return b"{}"


def niceness() -> bytes:
    """The worker's own CPU niceness, as JSON."""
    import os

    return str(os.nice(0)).encode()

"""Failed authentication per client address: wrong login forms and wrong bearer tokens share
one limit, so that guessing a token costs a few guesses a minute whichever door is tried.

The client is the peer address, or the address a trusted proxy forwards (MEMEST_FORWARDED_ALLOW_IPS,
applied by uvicorn's ProxyHeadersMiddleware in the app): an untrusted client's X-Forwarded-For is
ignored, so rotating it cannot reset the limit.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

from fastapi import Request

from memest.service.errors import TooManyRequests

#: Failed attempts one client address may make per FAILURE_WINDOW_S before it is answered 429.
MAX_FAILURES = 10
FAILURE_WINDOW_S = 60.0
#: Client addresses with recent failures kept before the quiet ones are dropped.
_MAX_CLIENTS = 10_000


class FailureLimiter:
    """Failed attempts per client address over the last FAILURE_WINDOW_S (in this process)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        while failures and failures[0] <= now - FAILURE_WINDOW_S:
            failures.popleft()
        return failures

    def wait_s(self, client: str) -> float:
        """Seconds until ``client`` may try again (0 when it may now)."""
        with self._lock:
            now = self._clock()
            failures = self._recent(client, now)
            if len(failures) < MAX_FAILURES:
                if not failures:
                    self._failures.pop(client, None)  # no entry kept for a quiet client
                return 0.0
            return failures[0] + FAILURE_WINDOW_S - now

    def failed(self, client: str) -> None:
        with self._lock:
            now = self._clock()
            if len(self._failures) > _MAX_CLIENTS:  # many addresses: drop those gone quiet
                for quiet in [c for c, f in self._failures.items() if not self._recent(c, now)]:
                    del self._failures[quiet]
            self._recent(client, now).append(now)

    def check(self, client: str, what: str) -> None:
        """Raise a 429 (with Retry-After) while ``client`` must wait."""
        wait = self.wait_s(client)
        if wait > 0:
            raise TooManyRequests(
                f"too many failed {what} from this address; try again in {math.ceil(wait)} s",
                retry_after_s=math.ceil(wait),
            )


def client_address(request: Request) -> str:
    """The client's address as the limits count it (see the module docstring)."""
    return request.client.host if request.client else "unknown"


def failure_limiter(request: Request) -> FailureLimiter:
    limiter: FailureLimiter = request.app.state.failure_limiter
    return limiter

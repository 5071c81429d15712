"""The uvicorn configuration ``memest serve`` runs: every read from a client is bounded.

uvicorn bounds a request head's size (h11_max_incomplete_event_size: past it h11 refuses the
request with a 400) and the idle time between keep-alive requests, but not the time a client
takes to send a head: a client trickling a header line byte by byte holds its connection (and a
slot of limit_concurrency) for as long as it likes. HeadDeadlineH11Protocol closes a connection
whose request head has not arrived whole within ``head_timeout_s``, counted from the connection
(first request) or from the first byte of the next request (keep-alive; the idle wait before
that byte is uvicorn's timeout_keep_alive). The body has its own deadline in the app (30 s, 408).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from memest.service.config import Settings


class HeadDeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline on each request head; ``head_timeout_s`` is set
    on the subclass that head_deadline_protocol makes."""

    head_timeout_s: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def _arm_head_deadline(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_overdue)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        # h11 keeps the client IDLE until a whole head has been parsed; once it has, the
        # request is the app's (its body deadline) and this timer has nothing to say.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm_head_deadline()  # the first byte of a keep-alive request: the clock starts
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)


def head_deadline_protocol(head_timeout_s: float) -> type[HeadDeadlineH11Protocol]:
    """The protocol class uvicorn builds per connection, with ``head_timeout_s`` fixed."""
    return type(
        "HeadDeadlineH11Protocol",
        (HeadDeadlineH11Protocol,),
        {"head_timeout_s": head_timeout_s},
    )


def uvicorn_config(
    app: Any, settings: Settings, *, host: str, port: int, **extra: Any
) -> uvicorn.Config:
    """uvicorn's Config for ``app`` with the read limits of ``settings`` (MEMEST_HEADER_TIMEOUT_S
    and the others); ``extra`` goes to uvicorn as given (log level, proxy headers)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=head_deadline_protocol(settings.header_timeout_s),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        limit_concurrency=settings.max_connections,
        backlog=settings.backlog,
        **extra,
    )

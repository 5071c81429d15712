"""The uvicorn configuration ``memest serve`` runs: every read from a client is bounded.

uvicorn bounds a request head's size (h11_max_incomplete_event_size: past it h11 refuses the
request with a 400) and the idle time between keep-alive requests, but not the time a client
takes to send a head: a client trickling a header line byte by byte holds its connection (and a
slot of limit_concurrency) for as long as it likes. HeadDeadlineH11Protocol closes a connection
whose request head has not arrived whole within ``head_timeout_s``, counted from the connection
(first request) or from the first byte of the next request (keep-alive; the idle wait before
that byte is uvicorn's timeout_keep_alive). The body has its own deadline in the app (30 s, 408;
10 s for the login form). ClientConnections caps the connections one client address holds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from memest.service.config import Settings


class ClientConnections:
    """Open connections per client address, capped (MEMEST_MAX_CONNECTIONS_PER_CLIENT): one
    client cannot take every slot of MEMEST_MAX_CONNECTIONS (trickled bodies, idle keep-alives).
    A trusted proxy (MEMEST_FORWARDED_ALLOW_IPS) carries many clients and is not capped."""

    def __init__(self, limit: int, trusted: list[str]) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}
        self._any = "*" in trusted
        self._trusted = [ipaddress.ip_network(t, strict=False) for t in trusted if _is_net(t)]

    def _exempt(self, host: str) -> bool:
        if self._any:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self._trusted)

    def open(self, host: str) -> bool:
        """Count a new connection of ``host``; False (not counted) when it is over the cap."""
        if self._exempt(host):
            return True
        count = self._open.get(host, 0)
        if count >= self.limit:
            return False
        self._open[host] = count + 1
        return True

    def close(self, host: str) -> None:
        count = self._open.get(host, 0) - 1
        if count > 0:
            self._open[host] = count
        else:
            self._open.pop(host, None)


def _is_net(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


_OVER_CAP = json.dumps(
    {"detail": "too many open connections from this address", "field": "connection"}
).encode()
_OVER_CAP_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: "
    + str(len(_OVER_CAP)).encode()
    + b"\r\nconnection: close\r\n\r\n"
    + _OVER_CAP
)


class HeadDeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline on each request head and a cap on connections per
    client; ``head_timeout_s`` and ``clients`` are set on the subclass that
    head_deadline_protocol makes."""

    head_timeout_s: float = 10.0
    clients: ClientConnections | None = None
    _head_timer: asyncio.TimerHandle | None = None
    _counted: str | None = None

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
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self.clients is not None and host:
            if not self.clients.open(host):
                transport.write(_OVER_CAP_ANSWER)
                transport.close()
                return
            self._counted = host
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm_head_deadline()  # the first byte of a keep-alive request: the clock starts
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        if self.clients is not None and self._counted is not None:
            self.clients.close(self._counted)
            self._counted = None
        super().connection_lost(exc)


def head_deadline_protocol(
    head_timeout_s: float, clients: ClientConnections | None = None
) -> type[HeadDeadlineH11Protocol]:
    """The protocol class uvicorn builds per connection, with ``head_timeout_s`` and the
    per-client count fixed."""
    return type(
        "HeadDeadlineH11Protocol",
        (HeadDeadlineH11Protocol,),
        {"head_timeout_s": head_timeout_s, "clients": clients},
    )


def uvicorn_config(
    app: Any, settings: Settings, *, host: str, port: int, **extra: Any
) -> uvicorn.Config:
    """uvicorn's Config for ``app`` with the read limits of ``settings`` (MEMEST_HEADER_TIMEOUT_S
    and the others); ``extra`` goes to uvicorn as given (log level). Forwarded headers are the
    app's (MEMEST_FORWARDED_ALLOW_IPS, memest.service.app), never uvicorn's own default."""
    clients = ClientConnections(settings.max_connections_per_client, settings.trusted_proxies())
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=head_deadline_protocol(settings.header_timeout_s, clients),
        proxy_headers=False,
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        limit_concurrency=settings.max_connections,
        backlog=settings.backlog,
        **extra,
    )

"""Below ASGI, where idle and half-sent connections are visible: a request-head timeout and a cap on open
connections per client address, as a subclass of uvicorn's HTTP protocol.

The app never sees a connection that has not sent a whole request head, so a slowloris client (one header line
every few seconds) would hold its socket for ever; uvicorn's keep-alive timeout only runs between requests.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

_REFUSED_BODY = b"too many connections from your address"
REFUSED_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 5\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)
TIMED_OUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


class ConnectionGuard:
    """The open connections of each client address, and the two limits. Event-loop only (not thread-safe)."""

    def __init__(self, max_per_address: int, header_timeout_s: float) -> None:
        self.max_per_address = max_per_address  # 0: no limit
        self.header_timeout_s = header_timeout_s
        self._open: dict[str, set[asyncio.BaseTransport]] = {}
        self.num_refused = 0
        self.num_timed_out = 0

    def num_open(self, host: str) -> int:
        """Open connections of `host` (WebSockets included)."""
        return len(self._open.get(host, ()))

    def admit(self, host: str, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection of `host`; False (not counted) when it already has the most it may."""
        connections = self._open.setdefault(host, set())
        if self.max_per_address and len(connections) >= self.max_per_address:
            connections.difference_update([t for t in connections if t.is_closing()])  # a safety net
            if len(connections) >= self.max_per_address:
                self.num_refused += 1
                _log_sometimes(
                    self.num_refused,
                    "refused a connection from %s: %d open, the limit",
                    host,
                    len(connections),
                )
                return False
        connections.add(transport)
        return True

    def release(self, host: str, transport: asyncio.BaseTransport) -> None:
        """The connection closed."""
        connections = self._open.get(host)
        if connections is not None:
            connections.discard(transport)
            if not connections:
                del self._open[host]

    def timed_out(self, host: str) -> None:
        """A connection of `host` did not send its request head in time."""
        self.num_timed_out += 1
        _log_sometimes(
            self.num_timed_out,
            "closed a connection from %s: no request head in %g s",
            host,
            self.header_timeout_s,
        )


def _log_sometimes(count: int, message: str, *args: object) -> None:
    # the 1st, 2nd, 4th, 8th ... time: an attack does not flood the log
    if count & (count - 1) == 0:
        logger.warning(message + " (%d so far)", *args, count)


def guarded_protocol(base: type[asyncio.Protocol], guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """`base` (uvicorn's httptools or h11 protocol) with `guard`'s limits; WebSocket upgrades stay counted."""

    class GuardedHTTPProtocol(base):  # type: ignore[misc, valid-type]
        _admitted = False
        _host = "unknown"
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._host = self.client[0] if self.client else "unknown"
            if not guard.admit(self._host, transport):
                transport.write(REFUSED_RESPONSE)
                transport.close()
                return
            self._admitted = True
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            if self._admitted:
                guard.release(self._host, self.transport)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self._admitted and self._between_requests():
                self._arm_head_timer()  # the first bytes of the next request on a kept-alive connection
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle or self.transport.get_protocol() is not self:
                self._cancel_head_timer()  # a whole head arrived (a new request), or the socket was upgraded

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._cancel_head_timer()
            super().handle_websocket_upgrade(*args)
            socket = self.transport.get_protocol()
            if self._admitted and socket is not self:  # its own connection_lost must give the slot back
                host, transport, lost = self._host, self.transport, socket.connection_lost

                def connection_lost(exc: Exception | None) -> None:
                    guard.release(host, transport)
                    lost(exc)

                socket.connection_lost = connection_lost
                self._admitted = False  # released by the socket, not by this protocol

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(guard.header_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self or not self._between_requests():
                return
            guard.timed_out(self._host)
            transport.write(TIMED_OUT_RESPONSE)
            transport.close()

    return GuardedHTTPProtocol

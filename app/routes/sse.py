"""Server-sent event responses with the service's ping, shutdown grace and slow-reader timeout."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Scope, Send

from app.settings import Settings

logger = logging.getLogger(__name__)
PING_S = 15


class _EventStream(EventSourceResponse):
    """An EventSourceResponse that ends quietly when its reader stalls past the send timeout, and always runs
    `on_close` at its end: a generator that never started (the client left before the first event) runs no
    `finally` of its own."""

    on_close: Callable[[], None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException as exc:
            if not _only_send_timeouts(exc):
                raise
            # the body iterator was closed (its finally blocks ran: the request is aborted); nothing left to send
            logger.warning("the client took no data for %s s: stream closed", self.send_timeout)
        finally:
            if self.on_close is not None:
                self.on_close()


def _only_send_timeouts(exc: BaseException) -> bool:
    if isinstance(exc, SendTimeoutError):
        return True
    inner = getattr(exc, "exceptions", None)  # an exception group from the response's task group
    return bool(inner) and all(_only_send_timeouts(e) for e in inner)


def event_stream(
    events: AsyncIterator[dict[str, str]], settings: Settings, on_close: Callable[[], None] | None = None
) -> EventSourceResponse:
    """Stream `events` as SSE: pings keep proxies open, shutdown waits `shutdown_grace_s` for the stream to end,
    a client that takes nothing for `slow_reader_timeout_s` is cut off, and `on_close` (idempotent: abort the
    work unless it finished, release the client's slot) runs however the response ends."""
    response = _EventStream(
        events,
        ping=PING_S,
        shutdown_grace_period=settings.shutdown_grace_s,
        send_timeout=settings.slow_reader_timeout_s,
    )
    response.on_close = on_close
    return response

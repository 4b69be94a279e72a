"""Server-sent event responses with the service's ping, slow-reader timeout, and a final event at shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from app.http.services import Services
from app.http.shutdown import END_WAIT_S, Flag

logger = logging.getLogger(__name__)
PING_S = 15
Event = dict[str, str]
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse_json(value: Any) -> str:
    """JSON for an SSE `data:` field: UTF-8 as is, but U+0085/U+2028/U+2029 escaped, since clients that split
    lines with str.splitlines() (httpx's iter_lines among them) would cut an event there."""
    return json.dumps(value, ensure_ascii=False).translate(_LINE_BREAKS)


@dataclass(frozen=True)
class Revocation:
    """How a stream ends when its credential does (app/http/credentials.py): `wait()` returns then, and
    `farewell()` gives the stream's last events (an error saying why)."""

    wait: Callable[[], Awaitable[None]]
    farewell: Callable[[], list[Event]]


class _EventStream(EventSourceResponse):
    """An EventSourceResponse that ends quietly when its reader stalls past the send timeout, and always runs
    `on_close` at its end: a generator that never started (the client left before the first event) runs no
    `finally` of its own."""

    on_close: Callable[[], None] | None = None

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        """One ASGI message under the slow-reader timeout, as sse-starlette's own, through asyncio's timeout: one
        timer a send, where anyio's cancel scope cost several times that on every token of every stream."""
        if self.send_timeout is None:
            await send(message)
            return
        try:
            async with asyncio.timeout(self.send_timeout):
                await send(message)
        except TimeoutError:
            raise SendTimeoutError() from None

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
    events: AsyncIterator[Event],
    svc: Services,
    farewell: Callable[[], list[Event]],
    on_close: Callable[[], None] | None = None,
    *,
    end_wait_s: float = END_WAIT_S,
    headers: dict[str, str] | None = None,
    revoked: Revocation | None = None,
) -> EventSourceResponse:
    """Stream `events` as SSE: pings keep proxies open, a client that takes nothing for `slow_reader_timeout_s` is
    cut off, and `on_close` (idempotent: abort the work unless it finished, release the client's slot) runs however
    the response ends.

    At shutdown, once the grace period is over (`svc.shutdown.closing`), `events` get `end_wait_s` more to end by
    themselves (a cut reply sends its own last event), then they are closed and `farewell()` events end the
    stream: a client always learns why its stream ended. With `revoked`, the stream is cut the same way, at once,
    when its credential is gone, and `revoked.farewell()` ends it.
    """
    settings = svc.settings
    response = _EventStream(
        _until_closing(events, svc.shutdown.closing, end_wait_s, farewell, revoked),
        ping=PING_S,
        headers=headers,
        # sse-starlette's own cut at SIGTERM, a backstop only: the streams end before it
        shutdown_grace_period=settings.shutdown_grace_s + end_wait_s + 1.0,
        send_timeout=settings.slow_reader_timeout_s,
    )
    response.on_close = on_close
    return response


async def _until_closing(
    events: AsyncIterator[Event],
    closing: Flag,
    end_wait_s: float,
    farewell: Callable[[], list[Event]],
    revoked: Revocation | None = None,
) -> AsyncIterator[Event]:
    """`events` until they end; once `closing` is set, they get `end_wait_s` to end, then `farewell()` ends it;
    once `revoked.wait()` returns, they are cut at once and `revoked.farewell()` ends it.

    Each wait for the source's next event runs under an asyncio timeout with no deadline until a cut is due, which
    then gives the wait under way (and every later one) the deadline: a cut while the source waits is the
    timeout's cancellation, thrown into the source there, so its finally blocks run before the farewell (a source
    suspended at its yield is closed after it). Per event that is one small object, where
    racing the source (a task for each event) against the flag with asyncio.wait cost ~40 µs of the event loop a
    token; the credential's watcher is one task a stream, asleep between its checks."""
    loop = asyncio.get_running_loop()
    source = aiter(events)
    deadline: float | None = None
    waiting: asyncio.Timeout | None = None  # the timeout around the wait under way, if one is
    goodbye = farewell  # the last events of a cut stream: the shutdown's or the revocation's

    def cut(at: float, last: Callable[[], list[Event]]) -> None:
        nonlocal deadline, goodbye
        if deadline is not None and deadline <= at:  # an earlier cut stands
            return
        deadline, goodbye = at, last
        if waiting is not None:
            waiting.reschedule(deadline)

    def on_closing(done: asyncio.Future) -> None:
        if not done.cancelled():
            cut(loop.time() + end_wait_s, farewell)

    def on_revoked(done: asyncio.Future) -> None:
        if done.cancelled():
            return
        if done.exception() is not None:  # a bug in a check: fail closed, loudly
            logger.error("a stream's credential check failed: stream cut", exc_info=done.exception())
        else:
            logger.info("a stream's credential was revoked: stream cut")
        assert revoked is not None
        cut(loop.time(), revoked.farewell)

    closed = asyncio.ensure_future(closing.wait())
    closed.add_done_callback(on_closing)
    watching = None
    if revoked is not None:
        watching = asyncio.ensure_future(revoked.wait())
        watching.add_done_callback(on_revoked)
    try:
        while deadline is None or loop.time() < deadline:
            timeout = waiting = asyncio.timeout_at(deadline)  # an absolute loop time, as reschedule takes
            try:
                async with timeout:
                    event = await anext(source)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not timeout.expired():  # the source's own
                    raise
                break
            finally:
                waiting = None
            yield event
        if goodbye is farewell and end_wait_s:
            logger.warning("a stream had not ended %g s after the shutdown's grace period: cut", end_wait_s)
        for event in goodbye():
            yield event
    finally:
        closed.cancel()
        if watching is not None:
            watching.cancel()
        if isinstance(source, AsyncGenerator):
            # suspended at its yield (a stalled reader was cut off): close it now, not when it is collected
            asyncio.ensure_future(source.aclose())

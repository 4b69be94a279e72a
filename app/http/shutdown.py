"""The shutdown protocol's state, made before anything starts (a signal may arrive while the app starts): when
draining began (no new replies from then on) and the flag that tells every stream to finish once the grace period
is over. `Services.drain` runs the protocol over it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from app.http.errors import APIError

# after the grace period, how long a stream may take to send its final event (a cut reply is stored first)
END_WAIT_S = 2.0
SHUTDOWN_MESSAGE = "the server is shutting down: this stream was cut; retry on another instance or later"


class Flag:
    """A one-way flag that coroutines may wait for, whatever event loop they run on (an asyncio.Event belongs to
    the first loop that waits on it; tests drive one app from several)."""

    def __init__(self) -> None:
        self._set = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        for loop, future in list(self._waiters):
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(_resolve, future)

    async def wait(self) -> None:
        """Return once the flag is set."""
        if self._set:
            return
        loop = asyncio.get_running_loop()
        waiter = (loop, loop.create_future())
        self._waiters.add(waiter)
        try:
            await waiter[1]
        finally:
            self._waiters.discard(waiter)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Shutdown:
    """Whether the server is draining (since when), and `closing`: set when the grace period is over, when every
    stream sends its final event and ends and every socket closes."""

    def __init__(self) -> None:
        self.draining_since: float | None = None
        self.closing = Flag()
        # set by the server (app.http.server.DrainingServer): drain and exit, the engine having died; unset when no
        # server runs the app (an app driven in process, as tests drive it): the app then stays up, answering 503
        self.on_engine_failure: Callable[[str], None] | None = None

    def engine_failed(self, reason: str) -> None:
        """The engine died while serving (`--exit-on-engine-failure`): the server, if one runs the app, drains and
        exits so that its supervisor restarts it."""
        if self.on_engine_failure is not None:
            self.on_engine_failure(reason)

    def start_draining(self) -> None:
        """Stop admitting new replies (the server received SIGTERM/SIGINT); running ones may finish."""
        if self.draining_since is None:
            self.draining_since = time.monotonic()

    def check_admitting(self) -> None:
        """Raise 503 once the server is shutting down."""
        if self.draining_since is not None:
            raise APIError(
                503,
                "the server is shutting down and admits no new requests; retry on another instance or later",
                code="shutting_down",
                headers={"Retry-After": "5", "Connection": "close"},
            )

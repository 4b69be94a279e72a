"""Per-client limits on generation requests: a rolling-minute rate and a cap on requests in flight at once."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from app.services.errors import APIError

WINDOW_S = 60.0
MAX_TRACKED_CLIENTS = 100_000  # least recently seen clients are forgotten past this (memory stays bounded)


class Lease:
    """One admitted request's slot; `release()` (idempotent) gives it back."""

    def __init__(self, release: Callable[[], None] | None) -> None:
        self._release = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class ClientLimiter:
    """Admits a client's generation request or raises 429 naming the limit. Event-loop only (not thread-safe)."""

    def __init__(
        self, requests_per_minute: int, max_streams: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.requests_per_minute = requests_per_minute
        self.max_streams = max_streams
        self._clock = clock
        # client -> admission times in the window, most recently seen client last
        self._recent: OrderedDict[str, deque[float]] = OrderedDict()
        self._in_flight: dict[str, int] = {}
        self.num_rejected = 0

    def admit(self, client: str) -> Lease:
        """A lease for one request of `client`; APIError 429 with Retry-After when a limit is reached."""
        if self.max_streams and self._in_flight.get(client, 0) >= self.max_streams:
            self.num_rejected += 1
            raise APIError(
                429,
                f"too many concurrent requests for this client: the limit is {self.max_streams} at once; "
                "wait for one to finish",
                code="too_many_concurrent_requests",
                headers={"Retry-After": "1"},
            )
        if self.requests_per_minute:
            now = self._clock()
            recent = self._recent.pop(client, None) or deque()
            while recent and recent[0] <= now - WINDOW_S:
                recent.popleft()
            self._recent[client] = recent  # most recently seen last
            if len(recent) >= self.requests_per_minute:
                self.num_rejected += 1
                retry = max(1, math.ceil(recent[0] + WINDOW_S - now))
                raise APIError(
                    429,
                    f"rate limit reached: at most {self.requests_per_minute} requests per minute for this "
                    f"client; retry in {retry} s",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(retry)},
                )
            recent.append(now)
            while len(self._recent) > MAX_TRACKED_CLIENTS:
                self._recent.popitem(last=False)
        if not self.max_streams:
            return Lease(None)
        self._in_flight[client] = self._in_flight.get(client, 0) + 1
        return Lease(lambda: self._done(client))

    def in_flight(self, client: str) -> int:
        """Requests of `client` admitted and not yet released."""
        return self._in_flight.get(client, 0)

    def _done(self, client: str) -> None:
        left = self._in_flight[client] - 1
        if left:
            self._in_flight[client] = left
        else:
            del self._in_flight[client]

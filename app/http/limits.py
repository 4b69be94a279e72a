"""Per-client limits: generation requests (a rolling-minute rate, a cap in flight) and new identities per address."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from app.http.errors import APIError

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


class RollingCounter:
    """Events per key over a rolling minute, capped at `per_minute` (0: no cap). Event-loop only."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        # key -> event times in the window, most recently seen key last
        self._recent: OrderedDict[str, deque[float]] = OrderedDict()

    def hit(self, key: str) -> int | None:
        """Count one event of `key` and return None; or, at the cap, count nothing and return seconds to wait."""
        if not self.per_minute:
            return None
        now = self._clock()
        recent = self._recent.pop(key, None) or deque()
        while recent and recent[0] <= now - WINDOW_S:
            recent.popleft()
        self._recent[key] = recent  # most recently seen last
        if len(recent) >= self.per_minute:
            return max(1, math.ceil(recent[0] + WINDOW_S - now))
        recent.append(now)
        while len(self._recent) > MAX_TRACKED_CLIENTS:
            self._recent.popitem(last=False)
        return None


class ClientLimiter:
    """Admits a client's generation request or raises 429 naming the limit. Event-loop only (not thread-safe)."""

    def __init__(
        self, requests_per_minute: int, max_streams: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.requests_per_minute = requests_per_minute
        self.max_streams = max_streams
        self._rate = RollingCounter(requests_per_minute, clock)
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
        retry = self._rate.hit(client)
        if retry is not None:
            self.num_rejected += 1
            raise APIError(
                429,
                f"rate limit reached: at most {self.requests_per_minute} requests per minute for this "
                f"client; retry in {retry} s",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(retry)},
            )
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


class IdentityLimiter:
    """Caps how many new browser identities (no valid cookie yet) one address may use to create state per minute.

    Without it, a client that drops its cookie is a fresh owner on every request and per-owner quotas never bind.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._counter = RollingCounter(per_minute, clock)
        self.num_rejected = 0

    def admit(self, address: str) -> None:
        """Count one new identity from `address`; APIError 429 with Retry-After past the limit."""
        retry = self._counter.hit(address)
        if retry is None:
            return
        self.num_rejected += 1
        raise APIError(
            429,
            f"too many new identities from this address: at most {self.per_minute} requests per minute without "
            "the browser cookie may create sessions (new_identities_per_minute); keep the cookie the server sets "
            f"(or use an API key), or retry in {retry} s",
            code="identity_rate_limited",
            headers={"Retry-After": str(retry)},
        )

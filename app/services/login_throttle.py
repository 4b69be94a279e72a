"""Sign-in attempts per client address (admin tokens; account passwords): a few free failures, then an exponentially
growing wait."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from app.services.errors import APIError

FREE_FAILURES = 5  # wrong tokens an address may send before it has to wait
FIRST_WAIT_S = 1.0  # the wait after the last free failure; it doubles with every further failure
MAX_WAIT_S = 15 * 60.0
FORGET_AFTER_S = 3600.0  # an address that sent no wrong token for this long starts afresh
MAX_TRACKED_ADDRESSES = (
    10_000  # least recently failed addresses are forgotten past this (memory stays bounded)
)


@dataclass
class _Failures:
    count: int
    last_at: float
    locked_until: float


class LoginThrottle:
    """Counts wrong admin tokens per address and refuses (429 with Retry-After) while the address must wait.

    Event-loop only (not thread-safe). A locked address is refused before its token is even compared, so waiting
    out the delays is the only way to try more tokens: after 5 free failures the waits are 1, 2, 4, ... s (at most
    15 min), so 1,000 guesses take days instead of seconds.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, what: str = "wrong admin tokens") -> None:
        self._clock = clock
        self.what = what  # what the 429 says this address sent too many of
        self._failures: OrderedDict[str, _Failures] = OrderedDict()  # most recently failed last
        self.num_refused = 0

    def check(self, address: str) -> None:
        """Raise 429 (Retry-After: the seconds left) while `address` must wait."""
        entry = self._failures.get(address)
        if entry is None:
            return
        now = self._clock()
        if now - entry.last_at > FORGET_AFTER_S:
            del self._failures[address]
            return
        if now < entry.locked_until:
            self.num_refused += 1
            retry = max(1, math.ceil(entry.locked_until - now))
            raise APIError(
                429,
                f"too many {self.what} from this address: retry in {retry} s",
                code="too_many_attempts",
                headers={"Retry-After": str(retry)},
            )

    def failed(self, address: str) -> float:
        """Count a wrong token from `address`; returns how long it must now wait (0 while failures are free)."""
        now = self._clock()
        entry = self._failures.pop(address, None)
        if entry is None or now - entry.last_at > FORGET_AFTER_S:
            entry = _Failures(0, now, now)
        entry.count += 1
        entry.last_at = now
        wait = 0.0
        if entry.count >= FREE_FAILURES:
            wait = min(FIRST_WAIT_S * 2 ** (entry.count - FREE_FAILURES), MAX_WAIT_S)
        entry.locked_until = now + wait
        self._failures[address] = entry
        while len(self._failures) > MAX_TRACKED_ADDRESSES:
            self._failures.popitem(last=False)
        return wait

    def succeeded(self, address: str) -> None:
        """A right token: `address` starts afresh."""
        self._failures.pop(address, None)

"""Password-guessing throttles (account passwords, admin tokens, API keys): wrong secrets are counted per client
address and per account (or key), attempts count as they arrive, and past a few free failures each counter makes
its callers wait, the waits doubling up to a ceiling."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from app.http.errors import APIError

FORGET_AFTER_S = 3600.0  # a counter with no failure for this long starts afresh
MAX_TRACKED = (
    100_000  # per kind of counter; least recently used ones are forgotten past this (memory stays bounded)
)
# the kinds of wrong secret one throttle counts together (the accounts' passwords and the API keys share one per
# address, so that guessing either is slowed alike): a refusal names those its counter saw
WRONG_PASSWORDS = "wrong usernames or passwords"
WRONG_KEYS = "wrong API keys"
MAX_DOUBLINGS = 40  # 2**40 s is far past every ceiling; bounds the exponent of a counter that keeps failing


@dataclass(frozen=True)
class Policy:
    """One kind of counter: how many failures are free, then the first wait, doubling with every further failure up
    to `max_wait_s`; `scope` is what a refusal says the failures came from."""

    free_failures: int
    first_wait_s: float
    max_wait_s: float
    scope: str

    def wait_after(self, count: int) -> float:
        """How long a counter with `count` failures must wait (0 while failures are free)."""
        if count < self.free_failures:
            return 0.0
        return min(self.first_wait_s * 2 ** min(count - self.free_failures, MAX_DOUBLINGS), self.max_wait_s)


# per address: few free failures and a high ceiling, since an address only holds back its own user
ADDRESS = Policy(5, 1.0, 15 * 60.0, "from this address")
# per account (or key), over all addresses: more free failures and a low ceiling, so that an attacker with many
# addresses is slowed to ~12 guesses an hour but holds the real user back for 5 min at most, and not at all on a
# device that signed in to the account before (`device` in `begin`)
ACCOUNT = Policy(10, 1.0, 5 * 60.0, "for this account from devices that have not signed in to it")
# a device known to an account: counted on its own, as an address is
DEVICE = Policy(5, 1.0, 15 * 60.0, "from this device")


@dataclass
class _Counter:
    count: int = 0  # failures not yet forgotten or forgiven
    last_failed_at: float = -math.inf
    locked_until: float = 0.0
    in_flight: int = 0  # attempts begun and not yet ended
    by_subject: dict[str, int] = field(default_factory=dict)  # an address's failures per account or key
    # what was wrong in the failures counted ("wrong API keys", ...), in the order first seen: what a refusal names
    kinds: dict[str, None] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return not self.count and not self.in_flight


class _Table:
    """The counters of one policy, by key, least recently used first."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.counters: OrderedDict[str, _Counter] = OrderedDict()

    def get(self, key: str, now: float) -> _Counter:
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = _Counter()
            while len(self.counters) > MAX_TRACKED:
                self.counters.popitem(last=False)
        else:
            self.counters.move_to_end(key)
        if counter.count and now - counter.last_failed_at > FORGET_AFTER_S:
            counter.count, counter.locked_until = 0, 0.0
            counter.by_subject.clear()
            counter.kinds.clear()
        return counter

    def wait_s(self, counter: _Counter, now: float) -> float:
        """Seconds before `counter` admits another attempt; 0: now."""
        if now < counter.locked_until:
            return counter.locked_until - now
        if counter.in_flight and counter.count + counter.in_flight >= self.policy.free_failures:
            # attempts already being checked would use up the free failures: one at a time from here on
            return self.policy.first_wait_s
        return 0.0

    def fail(self, counter: _Counter, now: float, subject: str | None, kind: str) -> float:
        counter.count += 1
        counter.kinds[kind] = None
        counter.last_failed_at = now
        if subject is not None:
            counter.by_subject[subject] = counter.by_subject.get(subject, 0) + 1
        wait = self.policy.wait_after(counter.count)
        counter.locked_until = max(counter.locked_until, now + wait)
        return wait

    def forgive(self, counter: _Counter, subject: str | None) -> None:
        """A success: the failures of `subject` are forgotten (all of them when None); the rest still count."""
        forgiven = counter.count if subject is None else counter.by_subject.pop(subject, 0)
        counter.count -= forgiven
        if subject is None:
            counter.by_subject.clear()
        if not counter.count:
            counter.kinds.clear()
        if counter.count < self.policy.free_failures:
            counter.locked_until = 0.0

    def drop_if_idle(self, key: str, counter: _Counter) -> None:
        if counter.idle and self.counters.get(key) is counter:
            del self.counters[key]


class LoginThrottle:
    """Counts wrong secrets and refuses (429 with Retry-After) while a counter that applies must wait.

    Usage, for any secret checked for an account or key (`subject`, namespaced by the caller: "account:bob",
    "key:<id>"; None when the secret names no valid subject)::

        with throttle.begin(address, subject, device=known_device) as attempt:  # 429 while one must wait
            ok = await check(secret)  # slow work (a hash) happens inside: attempts count as they arrive
            if ok:
                attempt.succeeded()
            else:
                attempt.failed()
        # an attempt ended neither way (bad input, an error) is released: it counts for nothing

    Counters: the address (ADDRESS: 5 free failures, then 1, 2, 4 ... s up to 15 min); the subject over all
    addresses (ACCOUNT: 10 free, up to 5 min); or, when the caller recognised a device that signed in to the
    subject before (`device`: an id it vouches for), that device's counter instead of the subject's, so an attack
    on an account from many addresses does not lock its owner out of their own devices. An attempt in flight
    counts against the free failures until it ends: a burst beyond them is refused at once, and past them only
    one attempt at a time is checked. A success forgives the failures it proves were the owner's: this address's
    failures for that subject, and the counter of the device or (when none) the subject's; never the address's
    failures for other subjects, nor, from a known device, the failures other devices made on the subject.

    `check`/`failed`/`succeeded` are the one-shot form on an address alone, for secrets with no subject that are
    checked without awaiting in between (admin tokens). Event-loop only (not thread-safe).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        what: str = "wrong admin tokens",
        *,
        address: Policy = ADDRESS,
        subject: Policy = ACCOUNT,
        device: Policy = DEVICE,
    ) -> None:
        self._clock = clock
        self.what = what  # what the 429 says there were too many of, unless a failure named another kind
        self.addresses, self.subjects, self.devices = _Table(address), _Table(subject), _Table(device)
        self.num_refused = 0

    def begin(self, address: str, subject: str | None = None, *, device: str | None = None) -> Attempt:
        """Reserve an attempt for `subject` from `address` (and `device`, a device known to that subject); 429
        with Retry-After while one of their counters must wait."""
        now = self._clock()
        parts = [(self.addresses, address)]
        if device is not None:
            parts.append((self.devices, device))
        elif subject is not None:
            parts.append((self.subjects, subject))
        counters = [(table, key, table.get(key, now)) for table, key in parts]
        refusals = [(table.wait_s(counter, now), table.policy, counter) for table, _, counter in counters]
        wait_s, policy, refusing = max(refusals, key=lambda refusal: refusal[0])
        if wait_s > 0:
            for table, key, counter in counters:
                table.drop_if_idle(key, counter)
            self._refuse(wait_s, policy, refusing)
        for _, _, counter in counters:
            counter.in_flight += 1
        return Attempt(self, counters, subject)

    def check(self, address: str) -> None:
        """Raise 429 (Retry-After: the seconds left) while `address` must wait."""
        if address not in self.addresses.counters:
            return
        now = self._clock()
        counter = self.addresses.get(address, now)  # forgets failures older than FORGET_AFTER_S
        if now < counter.locked_until:
            self._refuse(counter.locked_until - now, self.addresses.policy, counter)
        self.addresses.drop_if_idle(address, counter)

    def failed(self, address: str, what: str | None = None) -> float:
        """Count a wrong secret from `address` (`what`: the kind, when not the throttle's own: "wrong API keys"
        where passwords are throttled too); returns how long it must now wait (0 while failures are free)."""
        now = self._clock()
        return self.addresses.fail(self.addresses.get(address, now), now, None, what or self.what)

    def succeeded(self, address: str) -> None:
        """A right secret with no subject: `address` starts afresh."""
        counter = self.addresses.counters.get(address)
        if counter is not None:
            self.addresses.forgive(counter, None)
            self.addresses.drop_if_idle(address, counter)

    def _refuse(self, wait_s: float, policy: Policy, counter: _Counter) -> None:
        self.num_refused += 1
        retry = max(1, math.ceil(wait_s))
        what = (
            " and ".join(counter.kinds) or self.what
        )  # e.g. "wrong usernames or passwords and wrong API keys"
        raise APIError(
            429,
            f"too many {what} {policy.scope}: retry in {retry} s",
            code="too_many_attempts",
            headers={"Retry-After": str(retry)},
        )


class Attempt:
    """One reserved attempt (from `LoginThrottle.begin`): end it with `failed()` or `succeeded()`; leaving its
    `with` block, or `release()`, ends it counting nothing."""

    def __init__(
        self, throttle: LoginThrottle, counters: list[tuple[_Table, str, _Counter]], subject: str | None
    ):
        self._throttle = throttle
        self._counters = counters
        self._subject = subject
        self._ended = False

    def failed(self) -> float:
        """A wrong secret: every counter of the attempt counts it; returns the longest wait that now applies."""
        now = self._throttle._clock()
        addresses = self._throttle.addresses
        waits = [
            table.fail(counter, now, self._subject if table is addresses else None, self._throttle.what)
            for table, _, counter in self._counters
        ]
        self.release()
        return max(waits)

    def succeeded(self) -> None:
        """A right secret: the subject's failures are forgiven (see LoginThrottle), other subjects' still count."""
        addresses = self._throttle.addresses
        for table, _, counter in self._counters:
            table.forgive(counter, self._subject if table is addresses else None)
        self.release()

    def release(self) -> None:
        """End the attempt, counting nothing more (idempotent)."""
        if self._ended:
            return
        self._ended = True
        for table, key, counter in self._counters:
            counter.in_flight -= 1
            table.drop_if_idle(key, counter)

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

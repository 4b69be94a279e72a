"""Passwords: argon2id hashes (argon2-cffi, RFC 9106's parameters), computed off the event loop on a few threads of
their own, behind a bounded queue.

Each hash takes ~64 MiB and a fifth of a second of CPU by design (argon2's 4 lanes run as 4 threads), so they run on
a pool of their own: a burst of sign-ins queues there instead of stalling the loop or taking the memory of a hash
per request. The queue is bounded: a check that would wait behind more than `max_queued` others is refused at once
(503), so a flood of guesses from many addresses cannot make other users' sign-ins wait for minutes. A check
from a device that signed in to the account before (its device cookie) is not refused by a full queue, one at a time
per account: a flood would otherwise keep every real user out, and an attacker holds such a cookie only for
accounts whose password it knows. The threads
run at a lower CPU priority (Linux), so that on a small machine the engine's streams keep their pace while hashes
run. A sign-in of an unknown user still verifies against a dummy hash, so the time taken does not tell which
usernames exist.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from app.http.errors import APIError

logger = logging.getLogger(__name__)
T = TypeVar("T")
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024
MAX_CONCURRENT_HASHES = 2
DEFAULT_MAX_QUEUED = 8  # app/settings.py's max_queued_password_checks
# the hashing threads' nice value. Measured on 2 busy cores (a 2-thread torch loop standing in for the engine, one
# thread hashing without pause): at 0 the loop kept ~1/4 of its pace, at 5 ~1/2, and a lone hash while the loop
# ran took about as long as at 0; at 10 that lone hash took ~2.5x as long (a sign-in while replies stream)
HASH_NICENESS = 5
RETRY_AFTER_S = 1


def check_password(value: object) -> str:
    """A new password as given; ValueError when it is not a string of 8 to 1024 characters."""
    if not isinstance(value, str):
        raise ValueError(f"password must be a string, got {type(value).__name__}")
    if not MIN_PASSWORD_CHARS <= len(value) <= MAX_PASSWORD_CHARS:
        raise ValueError(
            f"password must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters, got {len(value)}"
        )
    return value


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, as in a container)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_hash_threads(num_cpus: int) -> int:
    """Hashes run at once: one on a machine of 2 CPUs or fewer (one hash's 4 lanes already fill both), else two."""
    return 1 if num_cpus <= 2 else MAX_CONCURRENT_HASHES


def _lower_priority() -> None:
    """Run this hashing thread (and the lane threads argon2 starts from it) below the engine's priority."""
    if sys.platform != "linux":  # elsewhere the nice value is the whole process's
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HASH_NICENESS)
    except OSError as exc:
        logger.warning("could not lower the priority of a password hashing thread: %s", exc)


class Passwords:
    """Hashes and verifies passwords with `hasher` (default: argon2id with argon2-cffi's RFC 9106 parameters) on
    `num_threads` threads (default: `default_hash_threads`); a check that finds `max_queued` others waiting is
    refused (503)."""

    def __init__(
        self,
        hasher: PasswordHasher | None = None,
        *,
        max_queued: int = DEFAULT_MAX_QUEUED,
        num_threads: int = 0,
    ) -> None:
        if max_queued < 0:
            raise ValueError(f"max_queued must be non-negative, got {max_queued}")
        self.hasher = hasher or PasswordHasher()
        self.num_threads = num_threads or default_hash_threads(usable_cpus())
        self.max_queued = max_queued
        self._pool = ThreadPoolExecutor(
            max_workers=self.num_threads, thread_name_prefix="pagedchat-argon2", initializer=_lower_priority
        )
        self._lock = threading.Lock()  # the counts below change on the event loop and on the hashing threads
        self.num_pending = 0  # hashes and checks given to the pool and not finished (running or queued)
        self.num_refused = 0  # checks refused because the queue was full
        self._known: set[str] = set()  # accounts with a known device's check let past a full queue, pending
        self._dummy: str | None = None  # verified when the user is unknown

    def hash_now(self, password: str) -> str:
        """The hash of a password, on this thread (the CLI's)."""
        return self.hasher.hash(password)

    async def hash(self, password: str) -> str:
        """The hash of a password, off the event loop. Never refused: every caller has proved who it is (a right
        password, an invite, an admin), so only checks are bounded."""
        return await self._run(self.hasher.hash, password)

    async def verify(self, stored: str | None, password: str, *, known_device_of: str | None = None) -> bool:
        """Whether `password` matches the `stored` hash; None (no such user, or no password) is False after the
        same work as a real check. 503 with Retry-After when `max_queued` checks are waiting already, unless it
        comes from a device known to the account `known_device_of` and no other such check of it is pending."""
        return await self._run(self._verify, stored, password, bounded=True, known=known_device_of)

    def needs_rehash(self, stored: str) -> bool:
        """Whether a hash was made with other parameters than the hasher's (a sign-in then stores a new one)."""
        try:
            return self.hasher.check_needs_rehash(stored)
        except InvalidHashError:
            return True

    async def _run(
        self, fn: Callable[..., T], *args: object, bounded: bool = False, known: str | None = None
    ) -> T:
        """`fn(*args)` on the pool, counted as pending until it has finished there (a caller that stops waiting
        does not free its place while its hash still runs); `bounded`: refused (503) when the queue is full, except
        for one check at a time of each account in `known` (see `verify`)."""
        with self._lock:
            num_waiting = self.num_pending - self.num_threads
            full = bounded and num_waiting >= self.max_queued
            past_full = full and known is not None and known not in self._known
            if past_full:
                self._known.add(known)  # type: ignore[arg-type]
                full = False
            if full:
                self.num_refused += 1
            else:
                self.num_pending += 1
        if full:
            raise APIError(
                503,
                f"the server is busy checking passwords: {num_waiting} checks are waiting already, the most it "
                f"queues (max_queued_password_checks = {self.max_queued}); retry in {RETRY_AFTER_S} s",
                code="password_queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        finished = functools.partial(self._finished, known if past_full else None)
        try:
            future = self._pool.submit(fn, *args)
        except RuntimeError:  # the pool is shut down (the server is stopping)
            finished(None)
            raise
        future.add_done_callback(finished)
        return await asyncio.wrap_future(future)

    def _finished(self, known: str | None, _future: object) -> None:
        with self._lock:
            self.num_pending -= 1
            self._known.discard(known)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the hashing threads (the service is shutting down)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _verify(self, stored: str | None, password: str) -> bool:
        if stored is None:
            if self._dummy is None:
                self._dummy = self.hasher.hash("pagedchat: no such account")
            stored, password = self._dummy, password + "\0"  # never matches
        try:
            return self.hasher.verify(stored, password)
        except VerificationError:
            return False
        except InvalidHashError:
            logger.error("a stored password hash is not an argon2 hash: that account cannot sign in with it")
            return False

"""Passwords: argon2id hashes (argon2-cffi, RFC 9106's parameters), computed off the event loop, two at a time.

Each hash takes ~64 MiB and tens of milliseconds by design, so they run on a pool of their own: a burst of sign-ins
queues there instead of stalling the loop or taking the memory of a hash per request. A sign-in of an unknown user
still verifies against a dummy hash, so the time taken does not tell which usernames exist.
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import ThreadPoolExecutor

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

logger = logging.getLogger(__name__)
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024
MAX_CONCURRENT_HASHES = 2
USERNAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")


def normalize_username(value: object) -> str:
    """A username as stored: trimmed, lower case, 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit);
    ValueError saying what is wrong."""
    if not isinstance(value, str):
        raise ValueError(f"username must be a string, got {type(value).__name__}")
    name = value.strip().lower()
    if not USERNAME.match(name):
        raise ValueError(
            f"username {value[:80]!r} is not valid: use 1 to 64 of a-z, 0-9, '.', '_', '@', '-', starting with a "
            "letter or digit"
        )
    return name


def check_password(value: object) -> str:
    """A new password as given; ValueError when it is not a string of 8 to 1024 characters."""
    if not isinstance(value, str):
        raise ValueError(f"password must be a string, got {type(value).__name__}")
    if not MIN_PASSWORD_CHARS <= len(value) <= MAX_PASSWORD_CHARS:
        raise ValueError(
            f"password must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters, got {len(value)}"
        )
    return value


class Passwords:
    """Hashes and verifies passwords with `hasher` (default: argon2id with argon2-cffi's RFC 9106 parameters)."""

    def __init__(self, hasher: PasswordHasher | None = None) -> None:
        self.hasher = hasher or PasswordHasher()
        self._pool = ThreadPoolExecutor(
            max_workers=MAX_CONCURRENT_HASHES, thread_name_prefix="pagedchat-argon2"
        )
        self._dummy: str | None = None  # verified when the user is unknown

    def hash_now(self, password: str) -> str:
        """The hash of a password, on this thread (the CLI's)."""
        return self.hasher.hash(password)

    async def hash(self, password: str) -> str:
        """The hash of a password, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.hasher.hash, password)

    async def verify(self, stored: str | None, password: str) -> bool:
        """Whether `password` matches the `stored` hash; None (no such user, or no password) is False after the
        same work as a real check."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._verify, stored, password)

    def needs_rehash(self, stored: str) -> bool:
        """Whether a hash was made with other parameters than the hasher's (a sign-in then stores a new one)."""
        try:
            return self.hasher.check_needs_rehash(stored)
        except InvalidHashError:
            return True

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

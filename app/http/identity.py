"""Who a request acts as, in the shapes every feature reads: an account's owner id, the signed-in `Account`, the
`KeyAccount` of a per-account API key, a username's one spelling, and what work learns when its key is revoked.

The accounts feature (app/accounts/) makes and checks these; the HTTP layer attaches them to each request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.db import UserRecord
from app.http.errors import APIError

ACCOUNT_OWNER = (
    "user:"  # owner ids of accounts start with this (browser cookies: "browser:", API keys: "key:")
)
KEY_PREFIX = "pck_"  # what tells a per-account key from a server-wide `--api-key` value
REVOKED = "api_key_revoked"  # the error code (and chat `done` reason) of work its key's revocation ended
USERNAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")


def account_owner(user_id: str) -> str:
    """The owner id (and prefix-cache salt) of an account."""
    return ACCOUNT_OWNER + user_id


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


def revoked_error() -> APIError:
    """What a running request learns when the key that started it is revoked (or its account disabled)."""
    return APIError(
        401,
        "the API key that started this request was revoked, or its account disabled or deleted",
        code=REVOKED,
    )


@dataclass(frozen=True)
class Account:
    """The signed-in account of a request: who, and the sign-in it came with (`session_hash`)."""

    user: UserRecord
    session_hash: str

    @property
    def owner(self) -> str:
        return account_owner(self.user.id)


@dataclass(frozen=True)
class KeyAccount:
    """The account a request's API key acts as (its owner id: `account_owner(user.id)`), and which key
    (`key_id`) that is."""

    user: UserRecord
    key_id: str

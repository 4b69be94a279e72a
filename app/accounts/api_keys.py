"""Per-account API keys (`--auth local|oidc`): an account makes, lists and revokes its own; a request that sends
one (`Authorization: Bearer pck_...`) acts as the account: its owner id `user:<id>` owns the chats, is the
prefix-cache salt, the quota owner and the rate-limit client, as for the account's browser sign-in.

A key is `pck_` and 43 URL-safe characters (256 random bits), shown once when made; the database keeps its SHA-256
and its first 12 characters (`prefix`, for telling keys apart). Revoking a key, or disabling or deleting its
account, ends what it started and still runs (`KeyWork`): its /v1 streams end with an `api_key_revoked` error, its
chat replies stop as `interrupted`.

HTTP lives in app/accounts/key_routes.py and app/http/key_auth.py; this module sees plain values and the store.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from app.db import AccountConflict, ApiKeyRecord, Store, UserRecord
from app.http.errors import APIError
from app.http.identity import KEY_PREFIX, REVOKED, KeyAccount

logger = logging.getLogger(__name__)
NUM_PREFIX_CHARS = 12  # shown in listings: "pck_" and 8 characters (48 of the key's 256 bits)
MAX_KEY_CHARS = 128  # a longer token is no key of ours: refused without a database read
MAX_KEYS_PER_ACCOUNT = 20
MAX_NAME_CHARS = 64


def key_hash(key: str) -> str:
    """What the database keeps of a key: its SHA-256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class NewKey:
    """A key just made: its record and the secret, which is never shown again."""

    record: ApiKeyRecord
    secret: str


@dataclass
class _Work:
    user_id: str
    running: Callable[[], bool]
    end: Callable[[], None]


# how long a key revoked in this process is remembered by KeyWork (a request authenticated just before its
# revocation registers its work within this)
REMEMBER_REVOKED_S = 60.0


class KeyWork:
    """What each key started and still runs, so that its revocation can end it. Event-loop only.

    Entries are dropped as they finish (checked whenever the key starts something else) or when their key ends; a
    key revoked in this process stays known for REMEMBER_REVOKED_S, so work that registers after the revocation (it
    was authenticated just before) ends at once; later than that, a request with the key is refused when it is
    authenticated, and the streams' periodic credential check (app/http/credentials.py) covers the rest."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_key: dict[str, list[_Work]] = {}
        self._revoked: OrderedDict[str, float] = OrderedDict()  # key id -> when, oldest first

    def track(self, key: KeyAccount, running: Callable[[], bool], end: Callable[[], None]) -> None:
        """`end()` this work (while `running()`) when `key` is revoked."""
        now = self._clock()
        while self._revoked and next(iter(self._revoked.values())) < now - REMEMBER_REVOKED_S:
            self._revoked.popitem(last=False)
        if key.key_id in self._revoked:
            end()
            return
        works = [w for w in self._by_key.get(key.key_id, ()) if w.running()]
        works.append(_Work(key.user.id, running, end))
        self._by_key[key.key_id] = works

    def num_running(self, key_id: str) -> int:
        """How much of the key's work still runs."""
        return sum(w.running() for w in self._by_key.get(key_id, ()))

    def end_key(self, key_id: str) -> int:
        """The key was revoked: end its running work; returns how much."""
        self._revoked.pop(key_id, None)
        self._revoked[key_id] = self._clock()
        return _end(self._by_key.pop(key_id, []))

    def end_user(self, user_id: str) -> int:
        """The account was disabled or deleted (its keys revoked): end the work of every key of it."""
        key_ids = [k for k, works in self._by_key.items() if works and works[0].user_id == user_id]
        return sum(self.end_key(k) for k in key_ids)


def _end(works: list[_Work]) -> int:
    running = [w for w in works if w.running()]
    for work in running:
        work.end()
    return len(running)


class ApiKeyService:
    """API keys over the store, and the work they run (`work`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.work = KeyWork()

    async def create(self, user: UserRecord, name: object) -> NewKey:
        """A new key of `user`, named `name`: 400 for a bad name, 409 past MAX_KEYS_PER_ACCOUNT."""
        label = _checked_name(name)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        try:
            record = await self.store.accounts.create_api_key(
                user.id, label, secret[:NUM_PREFIX_CHARS], key_hash(secret), MAX_KEYS_PER_ACCOUNT
            )
        except AccountConflict as exc:
            raise APIError(409, str(exc), code="too_many_api_keys") from None
        logger.info("account %s made API key %s (%s)", user.id, record.id, record.prefix)
        return NewKey(record, secret)

    async def list_keys(self, user: UserRecord) -> list[ApiKeyRecord]:
        """The account's live keys, oldest first."""
        return await self.store.accounts.list_api_keys(user.id)

    async def revoke(self, user: UserRecord, key_id: str) -> int:
        """Revoke one of the account's keys and end its running work (returns how much); 404 when it has no live
        key of that id."""
        if not await self.store.accounts.revoke_api_key(user.id, key_id):
            raise APIError(404, f"API key {key_id[:40]!r} not found", code="not_found")
        num_ended = self.work.end_key(key_id)
        logger.warning("account %s revoked API key %s: %d running requests ended", user.id, key_id, num_ended)
        return num_ended

    async def authenticate(self, token: str) -> KeyAccount:
        """The account a `pck_` key acts as: 401 `invalid_api_key` for no such key (a guess: the caller counts it),
        `api_key_revoked` for a revoked one, `account_disabled` for a disabled account."""
        found = (
            await self.store.accounts.api_key_user(key_hash(token)) if len(token) <= MAX_KEY_CHARS else None
        )
        if found is None:
            raise APIError(401, "invalid API key", code="invalid_api_key")
        record, user = found
        if record.revoked:
            raise APIError(401, "this API key was revoked", code=REVOKED)
        if user.disabled:
            raise APIError(401, "the account of this API key is disabled", code="account_disabled")
        return KeyAccount(user, record.id)

    async def api_key_live(self, key_id: str) -> bool:
        """Whether the key still authenticates: it exists, is not revoked, and its account is enabled."""
        return await self.store.accounts.api_key_live(key_id)


def _checked_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise APIError(400, "name the key: send name as a non-empty string", param="name")
    label = name.strip()
    if len(label) > MAX_NAME_CHARS or not label.isprintable():
        raise APIError(
            400,
            f"name must be at most {MAX_NAME_CHARS} printable characters, got {len(label)}",
            param="name",
        )
    return label

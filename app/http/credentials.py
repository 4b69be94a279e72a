"""Long-lived streams re-check the credential they opened with: one mechanism for every socket and SSE response.

A chat socket, a reply over SSE, a streamed /v1 request and the admin feed may run for minutes; a sign-out, a
disabled, deleted or demoted account, a revoked admin sign-in or a new admin token must end them within seconds, not
at their next message. When a stream opens, `credential_of` records what it authenticated with, of what can be
revoked while it runs (an account's sign-in, the admin cookie, the admin token, a per-user API key); a browser
cookie, a server-wide `--api-key` and loopback admin cannot be, and such a stream is not watched. `until_revoked`
runs beside the stream and returns once none of the recorded credentials is valid any more, checked every
`credential_check_interval_s`; the stream then says why (an SSE error event, a WebSocket error frame and 4401) and
ends, which aborts its running reply as a disconnect does.

Cost: at most two lookups per credential per interval, however many streams share it (`CredentialChecks`), nothing
per token; a stream ends within 1.5 intervals of its revocation. A database that cannot answer a sign-in lookup
(StoreUnavailable) leaves the stream running until it can: cutting every chat on a busy database would be worse than
a few more seconds; the admin cookie's check refuses then, as `admin_cookie_valid` does everywhere (the admin page
reconnects).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import HTTPConnection

from app.db import StoreUnavailable
from app.http.account_auth import signed_in_account
from app.http.admin_auth import ADMIN_COOKIE, admin_cookie_valid, token_matches
from app.http.errors import APIError
from app.http.key_auth import API_KEY_ID_STATE
from app.http.security import bearer_token
from app.http.services import Services
from app.http.sse import Event, Revocation

logger = logging.getLogger(__name__)
_PRUNE_AFTER = 256  # cached results kept before the stale ones are dropped


@dataclass(frozen=True)
class Credential:
    """What a stream authenticated with, of what can be revoked while it runs; alive while any of it is valid."""

    session_hash: str | None = None  # an account's sign-in (the pagedchat_session cookie)
    admin_account: bool = False  # an admin stream: that account must also stay an admin
    admin_cookie: bool = False  # an admin sign-in (the pagedchat_admin cookie)
    admin_token: str | None = field(default=None, repr=False)  # the admin token it sent
    api_key_id: str | None = None  # a per-user API key

    @property
    def revocable(self) -> bool:
        """Whether anything here can end while the stream runs (else the stream is not watched)."""
        return bool(self.session_hash or self.admin_cookie or self.admin_token or self.api_key_id)


async def credential_of(
    conn: HTTPConnection, svc: Services, *, owner: str | None = None, admin: bool = False
) -> Credential:
    """The revocable credential of a connection its route has just let in: for a chat stream, of `owner` (the
    signed-in account when it is that owner, else a per-user API key); for an admin stream, every admin credential
    it showed that is valid now (the admin account, the admin cookie, the admin token)."""
    key_id = conn.scope.get("state", {}).get(API_KEY_ID_STATE)
    if key_id is not None and not admin:
        return Credential(api_key_id=str(key_id))
    account = signed_in_account(conn)
    if not admin:
        if account is not None and account.owner == owner:
            return Credential(session_hash=account.session_hash)
        return Credential()
    token = conn.headers.get("x-admin-token") or bearer_token(conn)
    is_admin_account = account is not None and account.user.is_admin
    return Credential(
        session_hash=account.session_hash if account is not None and is_admin_account else None,
        admin_account=is_admin_account,
        admin_cookie=ADMIN_COOKIE in conn.cookies and await admin_cookie_valid(conn, svc),
        admin_token=token if token is not None and token_matches(token, svc.settings) else None,
    )


class CredentialChecks:
    """Lookups shared by the streams of one app: a result is reused for half the check interval, and streams that
    ask at once wait for one lookup (N streams of one account cost at most two database reads an interval, and a
    stream ends within 1.5 intervals of its revocation)."""

    def __init__(self, interval_s: float) -> None:
        self.reuse_s = interval_s / 2
        self._results: dict[str, tuple[float, asyncio.Future[Any]]] = {}

    async def get(self, key: str, lookup: Callable[[], Awaitable[Any]], *, fresh: bool = False) -> Any:
        """The result of `lookup` for `key`, reused when younger than `reuse_s` (`fresh`: looked up now)."""
        now = time.monotonic()
        found = self._results.get(key)
        if found is not None and not fresh and now - found[0] < self.reuse_s:
            return await asyncio.shield(found[1])
        if len(self._results) >= _PRUNE_AFTER:
            self._results = {k: v for k, v in self._results.items() if now - v[0] < self.reuse_s}
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._results[key] = (now, future)
        try:
            result = await lookup()
        except BaseException as exc:
            self._results.pop(key, None)  # not cached: the next check asks again
            future.set_exception(exc)
            future.exception()  # retrieved: the streams waiting on it get it; none waiting is no error
            raise
        future.set_result(result)
        return result


def credential_checks(conn: HTTPConnection, svc: Services) -> CredentialChecks:
    """The app's shared lookups, made on first use."""
    checks = getattr(conn.app.state, "credential_checks", None)
    if checks is None:
        checks = conn.app.state.credential_checks = CredentialChecks(svc.settings.credential_check_interval_s)
    return checks


async def credential_alive(
    conn: HTTPConnection, svc: Services, credential: Credential, *, fresh: bool = False
) -> bool:
    """Whether any part of `credential` is still valid (`fresh`: no result of the last interval reused)."""
    checks = credential_checks(conn, svc)
    if credential.admin_token is not None and token_matches(credential.admin_token, svc.settings):
        return True
    if credential.session_hash is not None:
        store = svc.store
        user = await checks.get(
            "session:" + credential.session_hash,
            lambda: store.accounts.session_user(credential.session_hash),
            fresh=fresh,
        )
        if user is not None and (user.is_admin or not credential.admin_account):
            return True
    if credential.admin_cookie:
        value = conn.cookies.get(ADMIN_COOKIE, "")
        key = "admin-cookie:" + hashlib.sha256(value.encode()).hexdigest()
        if await checks.get(key, lambda: admin_cookie_valid(conn, svc), fresh=fresh):
            return True
    if credential.api_key_id is not None:
        key_id = credential.api_key_id
        if await checks.get("api-key:" + key_id, lambda: _api_key_live(svc, key_id), fresh=fresh):
            return True
    return False


async def _api_key_live(svc: Services, key_id: str) -> bool:
    return await svc.store.accounts.api_key_live(key_id)


async def until_revoked(conn: HTTPConnection, svc: Services, credential: Credential) -> None:
    """Return once `credential` is gone, checked every `credential_check_interval_s`; a lookup the database could
    not answer is tried again at the next interval."""
    interval_s = svc.settings.credential_check_interval_s
    while True:
        await asyncio.sleep(interval_s)
        try:
            if not await credential_alive(conn, svc, credential):
                return
        except StoreUnavailable as exc:
            logger.warning("a stream's credential was not checked (tried again in %g s): %s", interval_s, exc)


def revoked_error(what: str) -> APIError:
    """The 401 that ends a stream whose credential is gone (code `not_signed_in`, as a request without one)."""
    return APIError(
        401,
        f"not signed in: {what} ended because what it was opened with is gone (a sign-out, a password change, a "
        "disabled, deleted or demoted account, a revoked key or admin sign-in); sign in again",
        code="not_signed_in",
    )


def revocation(
    conn: HTTPConnection, svc: Services, credential: Credential, farewell: Callable[[], list[Event]]
) -> Revocation | None:
    """What `event_stream` needs to end an SSE response once `credential` is gone (`farewell()`: its last events);
    None when nothing there can be revoked."""
    if not credential.revocable:
        return None
    return Revocation(lambda: until_revoked(conn, svc, credential), farewell)

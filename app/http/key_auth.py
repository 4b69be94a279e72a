"""Which account a request's API key acts as (`--auth local|oidc`): `Authorization: Bearer pck_...`, looked up once
per request, as the session cookie is (app/http/account_auth.py).

The middleware puts the key's account (`KeyAccount`) or the refusal (401, or 429 while the address must wait) in
the scope's state, and the key's id in `scope["state"]["api_key_id"]` (what a long-lived stream re-checks with
`api_key_live`); `security.session_owner` and `api_caller` read it. Wrong keys are throttled per address with the
wrong passwords (`password_throttle`), in `_authenticate` only (no attempt reserved: see there). A bearer token without the `pck_` prefix is left
to the server-wide `--api-key` check, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.errors import APIError, from_exception
from app.http.identity import KEY_PREFIX, KeyAccount
from app.http.login_throttle import WRONG_KEYS

logger = logging.getLogger(__name__)
API_KEY_STATE = "api_key"  # scope["state"] key: KeyAccount, or the APIError that refused the key
API_KEY_ID_STATE = "api_key_id"  # scope["state"] key: the id of the key that authenticated the request
_SKIPPED_PREFIXES = ("/static/", "/health", "/metrics")


def _bearer_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token.startswith(KEY_PREFIX) else None
    return None


def key_account(conn: HTTPConnection) -> KeyAccount | None:
    """The account the request's API key acts as; None when it sent no `pck_` key; raises the key's refusal."""
    value = conn.scope.get("state", {}).get(API_KEY_STATE)
    if isinstance(value, APIError):
        raise value
    return value


def sent_key(conn: HTTPConnection) -> bool:
    """Whether the request sent a `pck_` key (valid or not): it is then no browser's cookie-authenticated call."""
    return API_KEY_STATE in conn.scope.get("state", {})


def end_with_key(
    conn: HTTPConnection, svc: Any, running: Callable[[], bool], end: Callable[[], None]
) -> None:
    """When an API key authenticated `conn`: `end()` this work (while `running()`) once the key is revoked or its
    account disabled or deleted."""
    value = conn.scope.get("state", {}).get(API_KEY_STATE)
    if isinstance(value, KeyAccount) and svc.accounts is not None:
        svc.accounts.keys.work.track(value, running, end)


class ApiKeyMiddleware:
    """With accounts on, authenticates the `pck_` API key of every HTTP request and WebSocket that sends one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not scope["path"].startswith(_SKIPPED_PREFIXES):
            svc = scope["app"].state.services
            key = _bearer_key(scope) if svc.settings.auth != "none" else None
            if key is not None:
                state = scope.setdefault("state", {})
                client = scope.get("client")
                result = await _authenticate(svc, key, client[0] if client else "unknown")
                state[API_KEY_STATE] = result
                if isinstance(result, KeyAccount):
                    state[API_KEY_ID_STATE] = result.key_id
        await self.app(scope, receive, send)


async def _authenticate(svc: Any, key: str, address: str) -> KeyAccount | APIError:
    """The key's account, or why not. The one place keys meet the throttle: a key is not looked up while its
    address must wait (after wrong passwords or keys), and only a key that is no key (a guess) counts as a
    failure; a revoked key or a disabled account's is a right secret that no longer works. A right key forgives
    nothing: a key of the guesser's own must not clear its count of wrong passwords for other accounts (issue #35
    item 1).

    No attempt is reserved while the key is looked up, as a password's is while it is hashed: a script's
    concurrent requests with its right key are no burst of guesses (reserving refused all but 5 of them with 429),
    and a lookup is one indexed read of a 256-bit key's SHA-256, so guesses that overlap it gain nothing."""
    assert svc.accounts is not None  # the middleware looks keys up only with accounts on
    try:
        svc.admission.password_throttle.check(address)
        return await svc.accounts.keys.authenticate(key)
    except APIError as exc:
        if exc.code == "invalid_api_key":
            wait_s = svc.admission.password_throttle.failed(address, WRONG_KEYS)
            logger.warning(
                "wrong API key from %s%s", address, f"; it must wait {wait_s:g} s" if wait_s else ""
            )
        return exc
    except Exception as exc:  # noqa: BLE001 - the database is down: the request learns it when it asks who
        logger.warning("API key not checked: %s", exc)
        return from_exception(exc)

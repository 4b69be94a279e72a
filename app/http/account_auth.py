"""Which account a request is signed in as (`--auth local|oidc`): the session cookie, looked up once per request.

The cookie holds a random secret (HttpOnly, SameSite=Lax, Secure with `cookie_secure`); the database keeps its
SHA-256 with an expiry, so sign-out, a password change or a disabled account end it on the server. The middleware
puts the account (or the lookup's failure) in the scope's state; `signed_in_account` reads it, synchronously, for
`session_owner` and every other place that asks who the caller is; a long-lived stream looks its sign-in up again
every `credential_check_interval_s` (app/http/credentials.py).
"""

from __future__ import annotations

import logging
from http.cookies import SimpleCookie
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.errors import APIError, from_exception
from app.http.identity import Account
from app.settings import Settings

logger = logging.getLogger(__name__)
ACCOUNT_COOKIE = "pagedchat_session"
ACCOUNT_STATE = "account"  # scope["state"] key: Account, None (not signed in) or APIError (lookup failed)
MAX_SECRET_CHARS = 128
# no identity needed: no database read (/metrics needs one: an admin account may read it; a scraper sends no cookie)
_SKIPPED_PREFIXES = ("/static/", "/health")


def not_signed_in(what: str = "this request") -> APIError:
    """The 401 of a request that needs an account and has none."""
    return APIError(
        401,
        f"not signed in: {what} needs an account; sign in at /login (the session cookie is missing, expired or "
        "was revoked by a sign-out, a password change or an admin)",
        code="not_signed_in",
    )


def session_cookie_header(settings: Settings, secret: str = "", *, clear: bool = False) -> str:
    """A Set-Cookie value: the sign-in's secret (or its removal), HttpOnly, SameSite=Lax."""
    max_age = 0 if clear else int(settings.account_session_days * 86400)
    parts = [f"{ACCOUNT_COOKIE}={'' if clear else secret}", "Path=/", f"Max-Age={max_age}", "HttpOnly"]
    # Lax: a link from elsewhere (an invite, the provider's redirect back) arrives signed in
    parts.append("SameSite=Lax")
    if settings.cookie_secure:
        parts.append("Secure")
    return "; ".join(parts)


def _cookie_secret(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name != b"cookie":
            continue
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(value.decode("latin-1"))
        except Exception:  # noqa: BLE001 - a malformed Cookie header is no cookie
            continue
        if ACCOUNT_COOKIE in jar:
            secret = jar[ACCOUNT_COOKIE].value
            return secret if 0 < len(secret) <= MAX_SECRET_CHARS else None
    return None


def signed_in_account(conn: HTTPConnection) -> Account | None:
    """The request's account, None when it is not signed in; raises the 503 of a lookup the database failed."""
    value = conn.scope.get("state", {}).get(ACCOUNT_STATE)
    if isinstance(value, APIError):
        raise value
    return value


def require_account(conn: HTTPConnection, what: str = "this request") -> Account:
    """The request's account; 401 when it is not signed in."""
    account = signed_in_account(conn)
    if account is None:
        raise not_signed_in(what)
    return account


def require_account_admin(conn: HTTPConnection) -> Account:
    """The request's account when it is an admin; 401 without one, 403 for another role."""
    account = require_account(conn, "managing accounts")
    if not account.user.is_admin:
        raise APIError(403, "only an admin account may manage accounts", code="admin_account_required")
    return account


class AccountMiddleware:
    """With accounts on, looks up the session cookie of every HTTP request and WebSocket (static files aside)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not scope["path"].startswith(_SKIPPED_PREFIXES):
            svc = scope["app"].state.services
            if svc.settings.auth != "none":
                scope.setdefault("state", {})[ACCOUNT_STATE] = await _lookup(svc, _cookie_secret(scope))
        await self.app(scope, receive, send)


async def _lookup(svc: Any, secret: str | None) -> Account | APIError | None:
    accounts = svc.accounts
    if secret is None or accounts is None:  # no cookie, or no accounts
        return None
    try:
        return await accounts.current(secret)
    except Exception as exc:  # noqa: BLE001 - the database is down: the request learns it when it asks who
        logger.warning("session cookie not checked: %s", exc)
        return from_exception(exc)

"""Who is admin: the admin token (header or Bearer), exchanged once on the sign-in form for a signed, HttpOnly,
SameSite=Strict cookie backed by a row in the database (sign-out and a new admin token revoke it, across restarts).
With accounts on, a signed-in admin account is an admin too, and no address is. Without a token and without
accounts, loopback clients only (`require_admin` says what loopback means). Wrong tokens are throttled per client
address."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from urllib.parse import parse_qs

from itsdangerous import BadSignature, TimestampSigner
from starlette.requests import HTTPConnection, Request

from app.db import StoreUnavailable
from app.http.account_auth import signed_in_account
from app.http.errors import APIError
from app.http.hosts import client_address
from app.http.security import bearer_token, require_admin
from app.http.services import Services
from app.settings import Settings

logger = logging.getLogger(__name__)
ADMIN_COOKIE = "pagedchat_admin"
ADMIN_COOKIE_MAX_AGE_S = 12 * 3600
MAX_LOGIN_BODY_BYTES = 4096


def _signer(settings: Settings) -> TimestampSigner:
    return TimestampSigner(settings.secret_key, salt="pagedchat-admin")


def token_fingerprint(settings: Settings) -> str | None:
    """A keyed digest of the admin token (what a sign-in row keeps, never the token); None without a token."""
    if not settings.admin_token:
        return None
    return hmac.new(settings.secret_key.encode(), settings.admin_token.encode(), hashlib.sha256).hexdigest()


def _session_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_matches(candidate: str, settings: Settings) -> bool:
    """Constant-time check of a submitted token against the configured admin token."""
    if not settings.admin_token:
        return False
    return hmac.compare_digest(candidate.encode(), settings.admin_token.encode())


def admin_cookie_header(settings: Settings, secret: str = "", *, clear: bool = False) -> str:
    """A Set-Cookie value: the signed sign-in secret (or its removal), HttpOnly, SameSite=Strict."""
    if clear:
        value, max_age = "", 0
    else:
        value, max_age = _signer(settings).sign(secret).decode(), ADMIN_COOKIE_MAX_AGE_S
    parts = [f"{ADMIN_COOKIE}={value}", "Path=/", f"Max-Age={max_age}", "HttpOnly", "SameSite=Strict"]
    if settings.cookie_secure:
        parts.append("Secure")
    return "; ".join(parts)


def _cookie_secret(conn: HTTPConnection, settings: Settings) -> str | None:
    """The secret of an admin cookie signed by this server in the last 12 h, else None."""
    value = conn.cookies.get(ADMIN_COOKIE)
    if not value or not settings.admin_token:
        return None
    try:
        return _signer(settings).unsign(value, max_age=ADMIN_COOKIE_MAX_AGE_S).decode()
    except BadSignature:  # also covers SignatureExpired
        return None


async def admin_cookie_valid(conn: HTTPConnection, svc: Services) -> bool:
    """True when the caller's admin cookie is a live sign-in made with the current admin token."""
    secret = _cookie_secret(conn, svc.settings)
    fingerprint = token_fingerprint(svc.settings)
    if secret is None or fingerprint is None:
        return False
    try:
        return await svc.store.admin.admin_session_valid(_session_hash(secret), fingerprint)
    except StoreUnavailable as exc:  # cannot tell: refuse
        logger.warning("admin cookie not checked: %s", exc)
        return False


async def sign_in(conn: HTTPConnection, svc: Services) -> str:
    """Record a new sign-in and return its Set-Cookie value (StoreUnavailable when it cannot be recorded)."""
    fingerprint = token_fingerprint(svc.settings)
    assert fingerprint is not None  # the sign-in form posts here only while an admin token is set
    secret = secrets.token_urlsafe(32)
    await svc.store.admin.create_admin_session(
        _session_hash(secret), fingerprint, client_address(conn), ADMIN_COOKIE_MAX_AGE_S
    )
    return admin_cookie_header(svc.settings, secret)


async def sign_out(conn: HTTPConnection, svc: Services) -> bool:
    """Revoke the caller's sign-in, if its cookie holds one; False when there was none to revoke."""
    secret = _cookie_secret(conn, svc.settings)
    if secret is None:
        return False
    return await svc.store.admin.revoke_admin_session(_session_hash(secret))


def check_attempts(conn: HTTPConnection, svc: Services) -> None:
    """429 while the caller's address must wait after wrong admin tokens."""
    svc.admission.login_throttle.check(client_address(conn))


def record_attempt(conn: HTTPConnection, svc: Services, *, ok: bool) -> None:
    """Count a submitted admin token, right or wrong, for the caller's address."""
    address = client_address(conn)
    if ok:
        svc.admission.login_throttle.succeeded(address)
        return
    wait_s = svc.admission.login_throttle.failed(address)
    logger.warning("wrong admin token from %s%s", address, f"; it must wait {wait_s:g} s" if wait_s else "")


async def check_admin(conn: HTTPConnection, svc: Services) -> None:
    """Admin access: a signed-in admin account (accounts on), a live admin cookie, else what `require_admin` accepts
    (the token in X-Admin-Token or as a Bearer token; without a token, loopback clients when accounts are off, no
    one by address when they are on); an address sending wrong tokens must wait (429)."""
    settings = svc.settings
    account = signed_in_account(conn) if settings.auth != "none" else None
    if account is not None and account.user.is_admin:
        return
    if not settings.admin_token:
        require_admin(conn, settings)  # accounts on: 401/403; off: loopback only
        return
    if await admin_cookie_valid(conn, svc):
        return
    if conn.headers.get("x-admin-token") is None and bearer_token(conn) is None:
        require_admin(conn, settings)  # 401: no token
        return
    check_attempts(conn, svc)
    try:
        require_admin(conn, settings)
    except APIError:
        record_attempt(conn, svc, ok=False)
        raise
    record_attempt(conn, svc, ok=True)


async def is_admin(conn: HTTPConnection, svc: Services) -> bool:
    """`check_admin` as a boolean."""
    try:
        await check_admin(conn, svc)
    except APIError:
        return False
    return True


async def read_login_token(request: Request) -> str:
    """The `token` field of a small urlencoded form (the sign-in form); empty when absent or malformed."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return ""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_LOGIN_BODY_BYTES:
            return ""
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        return ""
    values = fields.get("token") or [""]
    return values[0].strip()

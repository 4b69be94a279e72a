"""The admin page's sign-in: the admin token is exchanged once for a signed, HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs

from itsdangerous import BadSignature, TimestampSigner
from starlette.requests import HTTPConnection, Request

from app.routes.security import require_admin
from app.services.errors import APIError
from app.settings import Settings

ADMIN_COOKIE = "pagedchat_admin"
ADMIN_COOKIE_MAX_AGE_S = 12 * 3600
MAX_LOGIN_BODY_BYTES = 4096


def _signer(settings: Settings) -> TimestampSigner:
    return TimestampSigner(settings.secret_key, salt="pagedchat-admin")


def _token_digest(settings: Settings) -> str:
    # the cookie carries a keyed digest of the token, never the token: rotating the token signs everyone out
    return hmac.new(settings.secret_key.encode(), settings.admin_token.encode(), hashlib.sha256).hexdigest()[
        :32
    ]


def token_matches(candidate: str, settings: Settings) -> bool:
    """Constant-time check of a submitted token against the configured admin token."""
    if not settings.admin_token:
        return False
    return hmac.compare_digest(candidate.encode(), settings.admin_token.encode())


def admin_cookie_header(settings: Settings, *, clear: bool = False) -> str:
    """A Set-Cookie value: the signed admin session (or its removal), HttpOnly, SameSite=Strict."""
    if clear:
        value, max_age = "", 0
    else:
        value, max_age = _signer(settings).sign(_token_digest(settings)).decode(), ADMIN_COOKIE_MAX_AGE_S
    parts = [f"{ADMIN_COOKIE}={value}", "Path=/", f"Max-Age={max_age}", "HttpOnly", "SameSite=Strict"]
    if settings.cookie_secure:
        parts.append("Secure")
    return "; ".join(parts)


def admin_cookie_valid(conn: HTTPConnection, settings: Settings) -> bool:
    """True when the caller holds an unexpired admin cookie signed for the current token."""
    value = conn.cookies.get(ADMIN_COOKIE)
    if not value or not settings.admin_token:
        return False
    try:
        digest = _signer(settings).unsign(value, max_age=ADMIN_COOKIE_MAX_AGE_S).decode()
    except BadSignature:  # also covers SignatureExpired
        return False
    return hmac.compare_digest(digest, _token_digest(settings))


def check_admin(conn: HTTPConnection, settings: Settings) -> None:
    """Admin access: the admin cookie, else what `require_admin` accepts (token header, or loopback without a token)."""
    if settings.admin_token and admin_cookie_valid(conn, settings):
        return
    require_admin(conn, settings)


def is_admin(conn: HTTPConnection, settings: Settings) -> bool:
    """`check_admin` as a boolean."""
    try:
        check_admin(conn, settings)
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

"""The device cookie: a browser that signed in to an account gets a signed, long-lived cookie naming that account, so
that later password attempts from it are told apart from an attack on the account from elsewhere (the throttle
counts them per device, not against the account: OWASP's "device cookies" against online guessing).

It grants nothing by itself: it only exempts its holder from the account-wide wait (app/http/login_throttle.py);
the password is checked as always, and the address's and the device's own counters still apply.
"""

from __future__ import annotations

import secrets
from http.cookies import SimpleCookie

from itsdangerous import BadSignature, Signer
from starlette.requests import HTTPConnection

from app.http.identity import normalize_username
from app.settings import Settings

DEVICE_COOKIE = "pagedchat_device"
DEVICE_MAX_AGE_S = 365 * 24 * 3600
MAX_COOKIE_CHARS = 512
_SALT = "pagedchat-sign-in-device"  # a browser cookie's signature is no device cookie's


def account_subject(username: object) -> str | None:
    """What the password throttle counts an account's failures against besides the address (`account:<name>`,
    whether or not the account exists, so a refusal tells nothing about which do); None for no valid username."""
    try:
        return "account:" + normalize_username(username)
    except ValueError:
        return None


def _signer(settings: Settings) -> Signer:
    return Signer(settings.secret_key, salt=_SALT)


def known_device(conn: HTTPConnection, settings: Settings, subject: str | None) -> str | None:
    """The id of the request's device when its cookie says it signed in to `subject` before; else None."""
    if subject is None:
        return None
    value = _cookie(conn)
    if value is None:
        return None
    try:
        device_id, _, signed_subject = _signer(settings).unsign(value).decode().partition("/")
    except (BadSignature, UnicodeDecodeError):
        return None
    return device_id if signed_subject == subject else None


def device_cookie_header(settings: Settings, subject: str, device_id: str | None = None) -> str:
    """A Set-Cookie value: this device signed in to `subject` (a new device id unless it had one); sent only to
    /auth (the sign-in and password routes), HttpOnly, SameSite=Strict."""
    value = _signer(settings).sign(f"{device_id or secrets.token_urlsafe(16)}/{subject}").decode()
    parts = [
        f"{DEVICE_COOKIE}={value}",
        "Path=/auth",
        f"Max-Age={DEVICE_MAX_AGE_S}",
        "HttpOnly",
        "SameSite=Strict",
    ]
    if settings.cookie_secure:
        parts.append("Secure")
    return "; ".join(parts)


def _cookie(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("cookie")
    if not header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # noqa: BLE001 - a malformed Cookie header is no cookie
        return None
    if DEVICE_COOKIE not in jar:
        return None
    value = jar[DEVICE_COOKIE].value
    return value if 0 < len(value) <= MAX_COOKIE_CHARS else None

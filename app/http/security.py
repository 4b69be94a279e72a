"""Who is calling: API keys (server-wide `--api-key` values; with accounts, an account's own `pck_` keys), the signed
browser cookie, the admin token, loopback and WebSocket Origin checks."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets

from itsdangerous import BadSignature, Signer
from starlette.requests import HTTPConnection

from app.http.account_auth import require_account, signed_in_account
from app.http.csrf import check_browser_write, origin_is_allowed
from app.http.errors import APIError
from app.http.hosts import came_through_proxy, client_address, named_host, peer_address, shown
from app.http.identity import ACCOUNT_OWNER, KeyAccount, account_owner
from app.http.key_auth import API_KEY_STATE, key_account, sent_key
from app.http.login_throttle import WRONG_KEYS
from app.settings import Settings

logger = logging.getLogger(__name__)
BROWSER_COOKIE = "pagedchat_browser"
BROWSER_OWNER = "browser:"  # owner ids of browser identities start with this (API keys: "key:")
COOKIE_MAX_AGE_S = 365 * 24 * 3600
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # not no-referrer: under it browsers send `Origin: null` on same-origin form posts, which the CSRF check needs
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-cache",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
}


def make_signer(secret_key: str) -> Signer:
    """The signer of browser cookies (HMAC with the server's secret key)."""
    return Signer(secret_key, salt="pagedchat-browser-id")


def new_browser_id() -> str:
    """An unguessable browser id (192 random bits)."""
    return secrets.token_urlsafe(24)


def verify_browser_cookie(signer: Signer, value: str | None) -> str | None:
    """The browser id inside a signed cookie value, or None when absent or forged."""
    if not value:
        return None
    try:
        return signer.unsign(value).decode()
    except BadSignature:
        return None


def browser_cookie_header(signer: Signer, browser_id: str, *, secure: bool) -> str:
    """A Set-Cookie value: signed, HttpOnly, SameSite=Lax, for a year."""
    value = signer.sign(browser_id).decode()
    parts = [f"{BROWSER_COOKIE}={value}", "Path=/", f"Max-Age={COOKIE_MAX_AGE_S}", "HttpOnly", "SameSite=Lax"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def bearer_token(conn: HTTPConnection) -> str | None:
    """The token of an `Authorization: Bearer ...` header, if any."""
    header = conn.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def key_fingerprint(key: str) -> str:
    """A stable, non-reversible owner id for an API key."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _matches_any(candidate: str, secrets_: tuple[str, ...]) -> bool:
    # compare against every key, so the time taken does not tell which prefix matched
    found = False
    for key in secrets_:
        found |= hmac.compare_digest(candidate.encode(), key.encode())
    return found


def api_caller(conn: HTTPConnection, settings: Settings) -> str | None:
    """On /v1: the caller's owner id. With accounts on, an account's own `pck_` key (its account), a server-wide
    API key (when keys are set and one is sent) or the signed-in account (401 otherwise); without, what
    `require_api_key` says."""
    if settings.auth != "none" and (key := key_account(conn)) is not None:
        return account_owner(key.user.id)
    if settings.auth == "none" or (settings.api_keys and bearer_token(conn) is not None):
        return require_api_key(conn, settings)
    account = signed_in_account(conn)
    if account is None:
        key_hint = " or send an API key" if settings.api_keys else ""
        raise APIError(
            401,
            f"not signed in: /v1 needs an account here; sign in at /login{key_hint}",
            code="not_signed_in",
        )
    check_browser_write(conn, settings)  # the cookie authenticates it, whichever page sent it
    return account.owner


def require_api_key(conn: HTTPConnection, settings: Settings) -> str | None:
    """On /v1: the caller's owner id when keys are configured (401 otherwise); None when no keys are set. A
    server-wide key is an operator's string, perhaps a guessable one: wrong keys count against the address as
    wrong passwords do (`password_throttle`, 429 while it must wait), each as it arrives (nothing is awaited
    between the check and the count)."""
    if not settings.api_keys:
        return None
    token = bearer_token(conn)
    if token is None:
        raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    throttle = conn.app.state.services.admission.password_throttle
    address = client_address(conn)
    throttle.check(address)
    if not _matches_any(token, settings.api_keys):
        wait_s = throttle.failed(address, WRONG_KEYS)
        logger.warning("wrong API key from %s%s", address, f"; it must wait {wait_s:g} s" if wait_s else "")
        raise APIError(401, "invalid API key", code="invalid_api_key")
    return "key:" + key_fingerprint(token)


def session_owner(conn: HTTPConnection, settings: Settings) -> str:
    """THE identity of a caller, for everything keyed on who it is (its chats, quotas, rate limits, prefix-cache
    salt, presets): with accounts on (`--auth local|oidc`), the account of its `pck_` key if it sends one; its
    server-wide API key if it sends one; else, with accounts on, its signed-in account (401 when not signed in);
    else its browser cookie."""
    if settings.auth != "none" and (key := key_account(conn)) is not None:
        return account_owner(key.user.id)
    if settings.api_keys and bearer_token(conn) is not None:
        owner = require_api_key(conn, settings)
        assert owner is not None
        return owner
    if settings.auth != "none":
        return require_account(conn).owner
    browser_id = conn.scope.get("state", {}).get("browser_id")
    if not browser_id:
        raise APIError(
            401,
            f"no identity: send the {BROWSER_COOKIE} cookie (load a page first) or an API key",
            code="no_identity",
        )
    return BROWSER_OWNER + browser_id


def cookie_authenticated(conn: HTTPConnection, owner: str) -> bool:
    """Whether a cookie (the browser's, or an account's sign-in) is what identifies `owner`: its writes must then
    come from this server's pages (app/http/csrf.py). An API key in a header is no ambient credential."""
    return owner.startswith((BROWSER_OWNER, ACCOUNT_OWNER)) and not sent_key(conn)


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8 and ::1."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_admin(conn: HTTPConnection, settings: Settings) -> None:
    """Admin surface by token or address (`check_admin` adds admin accounts and the admin cookie): the admin token
    (constant-time compare) if one is set; else, with accounts on, nothing here (an admin account is needed: 401
    signed out, 403 signed in); else a loopback client. "Loopback" means: the connection itself comes from
    127.0.0.0/8 or ::1, not through a proxy (no forwarding header, not from `forwarded_allow_ips`: behind a
    same-host proxy every visitor would be loopback), naming one of the server's hosts ('*' does not count)."""
    if settings.admin_token:
        token = conn.headers.get("x-admin-token") or bearer_token(conn)
        if token is None:
            account_hint = " or sign in as an admin account" if settings.auth != "none" else ""
            raise APIError(
                401,
                f"admin token required: send 'X-Admin-Token: <token>'{account_hint}",
                code="admin_token_required",
            )
        if not hmac.compare_digest(token.encode(), settings.admin_token.encode()):
            raise APIError(403, "invalid admin token", code="invalid_admin_token")
        return
    if settings.auth != "none":  # accounts on: admin is an account's role, never an address
        account = signed_in_account(conn)
        if account is None:
            raise APIError(
                401,
                "the admin surface needs an admin account here: sign in at /login as an admin "
                "(or set PAGEDCHAT_ADMIN_TOKEN and send it)",
                code="admin_account_required",
            )
        raise APIError(
            403,
            f"account {account.user.username!r} is not an admin: the admin surface needs an admin account",
            code="admin_account_required",
        )
    if not is_loopback(peer_address(conn)):
        raise APIError(
            403,
            "the admin surface is reachable from loopback only unless PAGEDCHAT_ADMIN_TOKEN is set",
            code="admin_loopback_only",
        )
    if came_through_proxy(conn, settings):
        raise APIError(
            403,
            "the admin surface answers loopback clients only, and a request through a proxy (a forwarding header, "
            "or a connection from --forwarded-allow-ips) is not one: set PAGEDCHAT_ADMIN_TOKEN",
            code="admin_loopback_only",
        )
    if not named_host(conn, settings):
        raise APIError(
            403,
            f"the admin surface answers loopback clients by the server's own names only, not {shown(conn.headers.get('host'))} "
            "(--allowed-hosts '*' does not count): list the name in --allowed-hosts or set PAGEDCHAT_ADMIN_TOKEN",
            code="admin_loopback_only",
        )


def origin_allowed(conn: HTTPConnection, settings: Settings) -> bool:
    """WebSocket upgrades: no Origin (not a browser), else the CSRF check's rule (`origin_is_allowed`): the server's
    own origin (scheme included) or one of `allowed_origins`, both normalised."""
    origin = conn.headers.get("origin")
    return origin is None or origin_is_allowed(origin, conn, settings)


def client_identity(conn: HTTPConnection, owner: str | None = None) -> str:
    """Who a limit applies to: the session owner or API key when known, else the browser cookie, else the address."""
    if owner:
        return owner
    key = conn.scope.get("state", {}).get(API_KEY_STATE)
    if isinstance(key, KeyAccount):
        return account_owner(key.user.id)
    if (account := signed_in_account(conn)) is not None:
        return account.owner
    token = bearer_token(conn)
    if token is not None:
        return "key:" + key_fingerprint(token)
    browser_id = conn.scope.get("state", {}).get("browser_id")
    if browser_id:
        return "browser:" + browser_id
    return "addr:" + (conn.client.host if conn.client else "unknown")

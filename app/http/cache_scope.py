"""Whose cached prefixes a request may reuse: its caller's identity as the cache salt, narrowed by a request's own.

A cache hit is observable (`cached_tokens`, a faster first token), so with prefix-cache isolation (the default)
each caller's blocks are salted with who it is: its API key, else its signed browser cookie, else its address.
Without API keys a bearer token proves nothing, so it only narrows the address it came from. A request's own
`cache_salt` (vLLM's field) is appended to that identity: it can split a caller's cache further, never reach into
another caller's.
"""

from __future__ import annotations

from starlette.requests import HTTPConnection

from app.http.security import bearer_token, key_fingerprint
from app.settings import Settings


def caller_identity(conn: HTTPConnection, owner: str | None) -> str:
    """Who the caller is for the cache: a verified owner (API key, session owner), browser, address (+ token)."""
    if owner:
        return owner
    browser_id = conn.scope.get("state", {}).get("browser_id")
    identity = "browser:" + browser_id if browser_id else "addr:" + (conn.client.host if conn.client else "")
    token = bearer_token(conn)
    if token is not None:  # no API keys are configured, so the token is any string: it narrows, never joins
        identity += "\nbearer:" + key_fingerprint(token)
    return identity


def cache_salt(
    conn: HTTPConnection, settings: Settings, owner: str | None, requested: str | None = None
) -> str | None:
    """The salt of this request's blocks; None: it shares every cached prefix (isolation off, no own salt)."""
    base = caller_identity(conn, owner) if settings.prefix_cache_isolation else None
    if requested is None:
        return base
    return f"{base or 'shared'}\nrequest:{requested}"

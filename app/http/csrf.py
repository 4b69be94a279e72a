"""Cross-site request forgery: writes a browser makes with its cookie must come from the server's own pages.

A browser attaches the cookie to any request to this host, whoever's page sends it; it also tells the server whose
page that is. Every browser sends `Origin` on a cross-origin POST and on a same-origin fetch() that is not a GET, so a
write authenticated by the cookie must carry this server's origin (scheme://host:port of the request itself, from
its Host header) or one of `allowed_origins`. Without a usable Origin (absent, or `null` as some form posts send
it) the browser's `Sec-Fetch-Site: same-origin` or a same-origin `Referer` stand in; with none of them the write is
refused. A body must also be declared `application/json` (a file upload: `application/octet-stream`): a cross-site
page may send `text/plain`, a form or a multipart body without asking (a CORS preflight), never these.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from app.http.errors import APIError
from app.settings import Settings

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]  # scheme, host (lower case), port


def parse_origin(url: str) -> Origin | None:
    """(scheme, host, port) of an http(s) URL or origin, default ports filled in; None when it is not one."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[parts.scheme]


def own_origin(conn: HTTPConnection, settings: Settings) -> Origin | None:
    """The origin the request was sent to: its scheme (https with `cookie_secure`: the browser only talks HTTPS to
    us, even when a TLS proxy hands us plain HTTP) and its Host header."""
    host = conn.headers.get("host")
    scheme = (
        "https"
        if settings.cookie_secure
        else {"ws": "http", "wss": "https"}.get(conn.url.scheme, conn.url.scheme)
    )
    return parse_origin(f"{scheme}://{host}") if host else None


def _show(origin: Origin | None) -> str:
    if origin is None:
        return "unknown (no Host header)"
    scheme, host, port = origin
    return f"{scheme}://{host}" + ("" if _DEFAULT_PORTS[scheme] == port else f":{port}")


def allowed_origins(conn: HTTPConnection, settings: Settings) -> set[Origin]:
    """The origins whose pages may use the cookie here: the server's own and `allowed_origins`, each normalised by
    `parse_origin` (scheme, lower-case host, port; a trailing slash or a default port makes no difference)."""
    return {own_origin(conn, settings), *(parse_origin(o) for o in settings.allowed_origins)} - {None}


def origin_is_allowed(origin: str, conn: HTTPConnection, settings: Settings) -> bool:
    """Whether an Origin (or Referer) is one of `allowed_origins`: the one rule of the CSRF check and of the
    WebSocket handshake (app/http/security.py origin_allowed), so an origin passes both or neither."""
    return parse_origin(origin) in allowed_origins(conn, settings)


def cross_origin_reason(conn: HTTPConnection, settings: Settings) -> str | None:
    """Why this request does not come from the server's own pages (or an allowed origin); None when it does."""
    own = own_origin(conn, settings)
    origin = conn.headers.get("origin")
    if origin is not None and origin.strip() != "null":
        if origin_is_allowed(origin, conn, settings):
            return None
        return f"its Origin {origin[:100]!r} is neither this server's ({_show(own)}) nor in allowed_origins"
    if conn.headers.get("sec-fetch-site") == "same-origin":  # set by the browser itself, never by a page
        return None
    referer = conn.headers.get("referer")
    if referer:
        if origin_is_allowed(referer, conn, settings):
            return None
        return f"its Referer's origin is neither this server's ({_show(own)}) nor in allowed_origins"
    what = "Origin null" if origin is not None else "no Origin"
    return f"it carries {what} and no same-origin Referer, so nothing shows it comes from this server's pages"


def check_same_origin(conn: HTTPConnection, settings: Settings) -> None:
    """403 unless the request comes from the server's own pages or an allowed origin (see the module doc)."""
    reason = cross_origin_reason(conn, settings)
    if reason is not None:
        method = conn.scope.get("method", "GET")
        raise APIError(
            403,
            f"cross-origin request refused: {method} {conn.url.path} is authenticated by the browser cookie and "
            f"must come from this server's own pages, but {reason}",
            code="cross_origin_request",
        )


def has_body(conn: HTTPConnection) -> bool:
    """Whether the request declares a body (a non-zero Content-Length, or Transfer-Encoding)."""
    length = conn.headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in conn.headers


JSON = "application/json"
OCTET_STREAM = (
    "application/octet-stream"  # a file's raw bytes: no page may send it cross-site without a preflight
)


def check_browser_write(conn: HTTPConnection, settings: Settings, body_type: str = JSON) -> None:
    """A write authenticated by the browser cookie: same origin (403), and a body only as `body_type` (415)."""
    if conn.scope.get("method") not in UNSAFE_METHODS:
        return
    check_same_origin(conn, settings)
    content_type = conn.headers.get("content-type", "")
    if has_body(conn) and content_type.split(";", 1)[0].strip().lower() != body_type:
        raise APIError(
            415,
            f"unsupported content type {content_type[:80]!r}: send the body as 'Content-Type: {body_type}'",
            code="unsupported_media_type",
        )

"""Pure ASGI middleware: the allowed-hosts check, the connection's own address and the proxy's forwarding headers,
and per-request context (a request id for the logs, the browser cookie, security headers)."""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import re
import uuid
from http.cookies import SimpleCookie

from itsdangerous import Signer
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.http.error_handlers import error_response
from app.http.errors import APIError
from app.http.hosts import PEER_STATE, header, host_matches, parse_host, shown
from app.http.security import (
    BROWSER_COOKIE,
    SECURITY_HEADERS,
    browser_cookie_header,
    new_browser_id,
    verify_browser_cookie,
)
from app.settings import Settings

logger = logging.getLogger(__name__)

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("pagedchat_request_id", default="-")
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_NO_COOKIE_PREFIXES = ("/v1/", "/metrics", "/health")  # machine endpoints: no browser identity to hand out
MAX_HOSTS_LOGGED = 64  # each refused Host is logged once, up to this many (a scanner cannot flood the log)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every log record (\"-\" outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def new_request_id() -> str:
    """A short random request id."""
    return uuid.uuid4().hex[:16]


def _cookie_value(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            jar = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 - a malformed Cookie header is treated as no cookie
                continue
            if BROWSER_COOKIE in jar:
                return jar[BROWSER_COOKIE].value
    return None


class RequestContextMiddleware:
    """Sets scope state `request_id`, `browser_id` and `new_browser_id`; adds X-Request-Id, security headers and a
    new cookie."""

    def __init__(
        self, app: ASGIApp, *, signer: Signer, cookie_secure: bool = False, browser_identity: bool = True
    ) -> None:
        self.app = app
        self.signer = signer
        self.cookie_secure = cookie_secure
        self.browser_identity = browser_identity  # False (accounts on): no browser cookie is handed out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        incoming = next(
            (v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"x-request-id"), ""
        )
        request_id = incoming if _SAFE_REQUEST_ID.match(incoming) else new_request_id()
        browser_id = verify_browser_cookie(self.signer, _cookie_value(scope))
        set_cookie = None
        if (
            browser_id is None
            and self.browser_identity
            and scope["type"] == "http"
            and not scope["path"].startswith(_NO_COOKIE_PREFIXES)
        ):
            browser_id = new_browser_id()
            set_cookie = browser_cookie_header(self.signer, browser_id, secure=self.cookie_secure)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["browser_id"] = browser_id
        # minted here: where such a request creates state, it is limited per address (new_identities_per_minute)
        state["new_browser_id"] = set_cookie is not None

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["X-Request-Id"] = request_id
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
                if set_cookie is not None:
                    headers.append("Set-Cookie", set_cookie)
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            REQUEST_ID.reset(token)


class AllowedHostsMiddleware:
    """Every HTTP request and WebSocket upgrade must name an allowed host in its Host header (any port): else a 400
    naming the Host and the setting, before any route runs (a DNS-rebinding page names its own host)."""

    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        self.names = settings.allowed_host_names
        self.allow_any = settings.any_host_allowed
        self.logged: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allow_any or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        value = header(scope, b"host")
        host = parse_host(value)
        if host is not None and host_matches(host, self.names):
            await self.app(scope, receive, send)
            return
        if len(self.logged) < MAX_HOSTS_LOGGED and (value or "") not in self.logged:
            self.logged.add(value or "")
            logger.warning("refused %s on %s: not in --allowed-hosts", shown(value), scope["path"][:200])
        message = (
            f"{shown(value)} is not a host this server answers: add it to --allowed-hosts "
            "(PAGEDCHAT_ALLOWED_HOSTS) if clients reach the server by that name"
        )
        # on a WebSocket upgrade Starlette sends this as the handshake's HTTP denial response
        response = error_response(APIError(400, message, code="host_not_allowed"))
        for name, value_ in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value_)
        await response(scope, receive, send)


class ProxyMiddleware:
    """Notes the connection's own address (scope state `peer`: loopback admin asks for it), then, for a connection
    from one of `forwarded_allow_ips`, takes the client's address and scheme from X-Forwarded-For and
    X-Forwarded-Proto with uvicorn's own middleware (the rightmost address that is not a trusted proxy)."""

    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self.app = app
        proxies = settings.proxy_addresses
        # uvicorn trusts all only for exactly "*", and reads a network with host bits set as a name
        trusted = "*" if "*" in proxies else [str(ipaddress.ip_network(p, strict=False)) for p in proxies]
        self.forwarded = ProxyHeadersMiddleware(app, trusted_hosts=trusted) if proxies else app  # type: ignore[arg-type]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            scope.setdefault("state", {})[PEER_STATE] = client[0] if client else None
        await self.forwarded(scope, receive, send)

"""Per-request context (pure ASGI): a request id for the logs, the browser cookie, security headers."""

from __future__ import annotations

import contextvars
import logging
import re
import uuid
from http.cookies import SimpleCookie

from itsdangerous import Signer
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.routes.security import (
    BROWSER_COOKIE,
    SECURITY_HEADERS,
    browser_cookie_header,
    new_browser_id,
    verify_browser_cookie,
)

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("pagedchat_request_id", default="-")
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_NO_COOKIE_PREFIXES = ("/v1/", "/metrics", "/health")  # machine endpoints: no browser identity to hand out


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

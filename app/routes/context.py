"""The services one app instance owns, reachable from every route through `app.state.services`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from itsdangerous import Signer
from starlette.requests import HTTPConnection

from app.routes.security import BROWSER_OWNER, client_identity
from app.services.async_engine import AsyncEngine
from app.services.errors import APIError
from app.services.limits import ClientLimiter, IdentityLimiter, Lease
from app.services.metrics import Metrics
from app.settings import Settings

if TYPE_CHECKING:
    from app.db.store import Store
    from app.services.chat_service import ChatService
    from app.services.public_prefix import PublicPrefixes


@dataclass
class Services:
    """Built by `create_app`; the store and chat service are filled in by the lifespan at startup."""

    settings: Settings
    engine: AsyncEngine
    metrics: Metrics
    signer: Signer
    store: Store | None = None
    chat: ChatService | None = None
    public_prefixes: PublicPrefixes | None = None  # the published prompts' token heads, set with the store
    limiter: ClientLimiter = field(init=False)
    identities: IdentityLimiter = field(init=False)
    draining_since: float | None = None  # set when a shutdown signal arrives: no new replies from then on

    def __post_init__(self) -> None:
        self.limiter = ClientLimiter(
            self.settings.client_requests_per_minute, self.settings.client_max_streams
        )
        self.identities = IdentityLimiter(self.settings.new_identities_per_minute)

    def start_draining(self) -> None:
        """Stop admitting new replies (the server received SIGTERM/SIGINT); running ones may finish."""
        if self.draining_since is None:
            self.draining_since = time.monotonic()

    def admit(self, conn: HTTPConnection, owner: str | None = None) -> Lease:
        """Admit one generation request of this caller: 503 while shutting down, 429 past a client limit."""
        self.check_admitting()
        return self.limiter.admit(client_identity(conn, owner))

    def admit_new_identity(self, conn: HTTPConnection, owner: str) -> None:
        """A request about to create state for `owner`: when that is a browser identity it was just given (it sent
        no valid cookie), 429 past `new_identities_per_minute` for its address; a valid cookie or API key passes."""
        if owner.startswith(BROWSER_OWNER) and conn.scope.get("state", {}).get("new_browser_id"):
            self.identities.admit(conn.client.host if conn.client else "unknown")

    def check_admitting(self) -> None:
        """Raise 503 once the server is shutting down."""
        if self.draining_since is not None:
            raise APIError(
                503,
                "the server is shutting down and admits no new requests; retry on another instance or later",
                code="shutting_down",
                headers={"Retry-After": "5", "Connection": "close"},
            )


def services(conn: HTTPConnection) -> Services:
    """The app's services from a request or WebSocket."""
    return conn.app.state.services

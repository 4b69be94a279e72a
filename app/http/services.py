"""The services one app instance owns, reachable from every route through `app.state.services`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from itsdangerous import Signer
from starlette.requests import HTTPConnection

from app.engine_client.async_engine import AsyncEngine
from app.engine_client.request_stream import ServerShuttingDown
from app.http.errors import APIError
from app.http.limits import ClientLimiter, IdentityLimiter, Lease
from app.http.login_throttle import LoginThrottle
from app.http.security import BROWSER_OWNER, client_identity
from app.metrics.metrics import Metrics
from app.settings import Settings
from engine.core.sampling_defaults import BUILTIN, SamplingDefaults

if TYPE_CHECKING:
    from app.db.store import Store
    from app.http.public_prefix import PublicPrefixes

logger = logging.getLogger(__name__)
# after the grace period, how long a stream may take to send its final event (a cut reply is stored first)
END_WAIT_S = 2.0
SHUTDOWN_MESSAGE = "the server is shutting down: this stream was cut; retry on another instance or later"


class Flag:
    """A one-way flag that coroutines may wait for, whatever event loop they run on (an asyncio.Event belongs to
    the first loop that waits on it; tests drive one app from several)."""

    def __init__(self) -> None:
        self._set = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        for loop, future in list(self._waiters):
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(_resolve, future)

    async def wait(self) -> None:
        """Return once the flag is set."""
        if self._set:
            return
        loop = asyncio.get_running_loop()
        waiter = (loop, loop.create_future())
        self._waiters.add(waiter)
        try:
            await waiter[1]
        finally:
            self._waiters.discard(waiter)


class Replies(Protocol):
    """What the shared layers need of the chat feature (app/chat/service.py's ChatService): its streaming replies."""

    @property
    def num_streaming(self) -> int: ...

    def cut_all(self) -> int: ...


class Accounts(Protocol):
    """What the shared layers need of the accounts feature (app/accounts/service.py's AccountService): its API keys
    (`keys.authenticate`, `keys.work.track`) and its password hashing threads."""

    keys: Any
    passwords: Any


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


@dataclass
class Services:
    """Built by `create_app`; the store and chat service are filled in by the lifespan at startup."""

    settings: Settings
    engine: AsyncEngine
    metrics: Metrics
    signer: Signer
    store: Store | None = None
    chat: Replies | None = None
    public_prefixes: PublicPrefixes | None = None  # the published prompts' token heads, set with the store
    # what a request gets for the sampling fields it leaves out: server flags > model > built-in, set at startup
    sampling_defaults: SamplingDefaults = BUILTIN
    sampling_sources: dict[str, str] = field(default_factory=dict)  # field -> server, model or built-in
    limiter: ClientLimiter = field(init=False)
    identities: IdentityLimiter = field(init=False)
    login_throttle: LoginThrottle = field(default_factory=LoginThrottle)
    # accounts (--auth local|oidc): set at startup; wrong passwords (sign-ins, password changes) are throttled per
    # address and per account, as attempts arrive (app/http/login_throttle.py)
    accounts: Accounts | None = None
    password_throttle: LoginThrottle = field(
        default_factory=lambda: LoginThrottle(what="wrong usernames or passwords")
    )
    draining_since: float | None = None  # set when a shutdown signal arrives: no new replies from then on
    # set when the grace period is over: every stream sends its final event and ends, every socket closes
    closing: Flag = field(default_factory=Flag)

    def __post_init__(self) -> None:
        self.limiter = ClientLimiter(
            self.settings.client_requests_per_minute, self.settings.client_max_streams
        )
        self.identities = IdentityLimiter(self.settings.new_identities_per_minute)

    async def drain(self) -> None:
        """Shutdown: admit nothing new, let running requests finish within `shutdown_grace_s`, then end the
        rest (`end_streams`). Returns at once when the streams were already ended."""
        self.start_draining()
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while not self.closing.is_set() and time.monotonic() < deadline and self.num_running:
            await asyncio.sleep(0.05)
        self.end_streams()

    @property
    def num_running(self) -> int:
        """Generation requests and session replies not finished yet."""
        return self.engine.num_in_flight + (self.chat.num_streaming if self.chat is not None else 0)

    def end_streams(self) -> None:
        """The grace period is over: session replies are cut (stored `interrupted`, their `done` saying
        `shutdown`), other requests fail with ServerShuttingDown, and `closing` tells every stream to finish."""
        if self.closing.is_set():
            return
        num_replies = self.chat.cut_all() if self.chat is not None else 0
        num_requests = self.engine.end_streams(ServerShuttingDown(SHUTDOWN_MESSAGE))
        if num_replies or num_requests:
            logger.warning(
                "shutdown grace period over: cut %d session replies and %d other requests",
                num_replies,
                num_requests,
            )
        self.closing.set()

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

"""The services one app instance owns, built whole when it starts and reachable from every route through
`app.state.services`: no field is filled in later, so no handler checks for one that is missing."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from itsdangerous import Signer
from starlette.requests import HTTPConnection

from app.db.store import Store
from app.engine_client.protocol import EngineClient
from app.engine_client.request_stream import ServerShuttingDown
from app.http.admission import Admission
from app.http.model_registry import ModelRegistry
from app.http.public_prefix import PublicPrefixes
from app.http.shutdown import SHUTDOWN_MESSAGE, Shutdown
from app.metrics.metrics import Metrics
from app.settings import Settings
from engine.core.sampling_defaults import SamplingDefaults

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class Services:
    """Built by the app's lifespan once the store and the engine have started, before the app serves."""

    settings: Settings
    engine: EngineClient  # the default model's (--model): the chat's sessions run on it
    metrics: Metrics
    signer: Signer
    store: Store
    chat: Replies  # app/chat/service.py's ChatService
    public_prefixes: PublicPrefixes  # the published prompts' token heads
    # what a request gets for the sampling fields it leaves out: server flags > model > built-in
    sampling_defaults: SamplingDefaults
    sampling_sources: dict[str, str]  # field -> server, model or built-in
    models: ModelRegistry  # every served model, the default's handle among them; others load on demand
    accounts: Accounts | None  # app/accounts/service.py's AccountService; None: `--auth none`
    admission: Admission  # made with the app: limits and throttles
    shutdown: Shutdown  # made with the app: a signal may come while it starts

    async def drain(self) -> None:
        """Shutdown: admit nothing new, let running requests finish within `shutdown_grace_s`, then end the
        rest (`end_streams`). Returns at once when the streams were already ended."""
        self.shutdown.start_draining()
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while not self.shutdown.closing.is_set() and time.monotonic() < deadline and self.num_running:
            await asyncio.sleep(0.05)
        self.end_streams()

    @property
    def num_running(self) -> int:
        """Generation requests and session replies not finished yet."""
        return self.engine.num_in_flight + self.chat.num_streaming

    def end_streams(self) -> None:
        """The grace period is over: session replies are cut (stored `interrupted`, their `done` saying
        `shutdown`), other requests fail with ServerShuttingDown, and `closing` tells every stream to finish."""
        if self.shutdown.closing.is_set():
            return
        num_replies = self.chat.cut_all()
        num_requests = self.engine.end_streams(ServerShuttingDown(SHUTDOWN_MESSAGE))
        if num_replies or num_requests:
            logger.warning(
                "shutdown grace period over: cut %d session replies and %d other requests",
                num_replies,
                num_requests,
            )
        self.shutdown.closing.set()


def services(conn: HTTPConnection) -> Services:
    """The app's services from a request or WebSocket."""
    return conn.app.state.services

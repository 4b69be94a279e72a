"""The services one app instance owns, reachable from every route through `app.state.services`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from itsdangerous import Signer
from starlette.requests import HTTPConnection

from app.async_engine import AsyncEngine
from app.metrics import Metrics
from app.settings import Settings

if TYPE_CHECKING:
    from app.chat_service import ChatService
    from app.db.store import Store


@dataclass
class Services:
    """Built by `create_app`; the store and chat service are filled in by the lifespan at startup."""

    settings: Settings
    engine: AsyncEngine
    metrics: Metrics
    signer: Signer
    store: Store | None = None
    chat: ChatService | None = None


def services(conn: HTTPConnection) -> Services:
    """The app's services from a request or WebSocket."""
    return conn.app.state.services

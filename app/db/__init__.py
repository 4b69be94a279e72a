"""Storage of chat sessions and messages: SQLAlchemy models, Alembic migrations, and the async `Store`."""

from __future__ import annotations

from app.db.models import MessageStatus
from app.db.quota import QuotaExceeded, StorageQuota
from app.db.records import MessageRecord, SessionRecord, StoreUnavailable
from app.db.search import MATCH_END, MATCH_START, SearchHit, SearchPage, SearchUnsupported
from app.db.store import Store

__all__ = [
    "MATCH_END",
    "MATCH_START",
    "MessageRecord",
    "MessageStatus",
    "QuotaExceeded",
    "SearchHit",
    "SearchPage",
    "SearchUnsupported",
    "SessionRecord",
    "StorageQuota",
    "Store",
    "StoreUnavailable",
]

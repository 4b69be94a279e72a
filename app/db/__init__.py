"""Storage of chat sessions and messages: SQLAlchemy models, Alembic migrations, and the async `Store`."""

from __future__ import annotations

from app.db.models import MessageStatus
from app.db.quota import QuotaExceeded, StorageQuota
from app.db.records import MessageRecord, SessionRecord, StoreUnavailable
from app.db.store import Store
from app.db.tree import MessageTree, Parent

__all__ = [
    "MessageRecord",
    "MessageStatus",
    "MessageTree",
    "Parent",
    "QuotaExceeded",
    "SessionRecord",
    "StorageQuota",
    "Store",
    "StoreUnavailable",
]

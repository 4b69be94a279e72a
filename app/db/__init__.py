"""Storage of chat sessions, messages and presets: SQLAlchemy models, Alembic migrations, and the async `Store`."""

from __future__ import annotations

from app.db.accounts import AccountConflict, InviteRecord, UserRecord
from app.db.models import MessageStatus
from app.db.presets import PresetRef
from app.db.quota import QuotaExceeded, StorageQuota
from app.db.records import MessageRecord, PresetNameTaken, PresetRecord, SessionRecord, StoreUnavailable
from app.db.store import Store

__all__ = [
    "AccountConflict",
    "InviteRecord",
    "MessageRecord",
    "MessageStatus",
    "PresetNameTaken",
    "PresetRecord",
    "PresetRef",
    "QuotaExceeded",
    "SessionRecord",
    "StorageQuota",
    "Store",
    "StoreUnavailable",
    "UserRecord",
]

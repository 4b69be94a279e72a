"""Storage: SQLAlchemy models, Alembic migrations, the `Database` whose threads run every query (app/db/threads.py),
and one store per feature on it (`Store.chats`, `.presets`, `.accounts`, `.admin`: app/db/store.py)."""

from __future__ import annotations

from app.db.account_invites import InviteRecord
from app.db.account_keys import ApiKeyRecord
from app.db.accounts import AccountConflict, UserRecord
from app.db.models import MessageStatus
from app.db.presets import PresetRef
from app.db.prompt_history import PromptChange
from app.db.quota import QuotaExceeded, StorageQuota
from app.db.records import MessageRecord, PresetNameTaken, PresetRecord, SessionRecord, StoreUnavailable
from app.db.search import SearchUnsupported
from app.db.search_hits import MATCH_END, MATCH_START, SearchHit, SearchPage
from app.db.store import Store
from app.db.tree import MessageTree, Parent

__all__ = [
    "AccountConflict",
    "ApiKeyRecord",
    "InviteRecord",
    "MATCH_END",
    "MATCH_START",
    "MessageRecord",
    "MessageStatus",
    "PresetNameTaken",
    "PresetRecord",
    "PresetRef",
    "PromptChange",
    "MessageTree",
    "Parent",
    "QuotaExceeded",
    "SearchHit",
    "SearchPage",
    "SearchUnsupported",
    "SessionRecord",
    "StorageQuota",
    "Store",
    "StoreUnavailable",
    "UserRecord",
]

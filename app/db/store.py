"""The database of one app, and one store per feature on it: its chats, presets, accounts and admin sign-ins."""

from __future__ import annotations

from app.db.account_store import AccountStore
from app.db.admin_sessions import AdminStore
from app.db.database import DEFAULT_BUSY_TIMEOUT_MS
from app.db.presets import PresetStore
from app.db.queries import ChatStore, mark_streaming_interrupted
from app.db.quota import StorageQuota
from app.db.threads import Database


class Store(Database):
    """A SQL database (SQLite in WAL mode by default, or PostgreSQL), migrated to head at `start()`, and its
    feature stores: `chats` (sessions and messages, app/db/queries.py), `presets` (app/db/presets.py), `accounts`
    (app/db/account_store.py) and `admin` (app/db/admin_sessions.py). Records out, never ORM objects; bad
    arguments raise ValueError. At start, assistant rows a previous process left 'streaming' become 'interrupted'.
    """

    def __init__(
        self, url: str, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, quota: StorageQuota | None = None
    ) -> None:
        super().__init__(
            url, busy_timeout_ms=busy_timeout_ms, quota=quota, on_start=(mark_streaming_interrupted,)
        )
        self.chats = ChatStore(self)
        self.presets = PresetStore(self)
        self.accounts = AccountStore(self)
        self.admin = AdminStore(self)

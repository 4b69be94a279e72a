"""Storage quotas: what one owner may keep (sessions, messages, bytes of text) and how large the database may grow.

Checked inside the transaction of the write they guard, so concurrent writes of one owner cannot slip past a limit
together (the store runs one transaction at a time); an owner's usage is a running figure (app/db/usage.py). A write
that does not add sessions, messages or bytes is always allowed: an owner over a limit can still shorten and delete.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.db.usage import usage_of


@dataclass(frozen=True)
class StorageQuota:
    """The limits; 0 means no limit. `max_database_bytes` counts the SQLite pages in use (PostgreSQL: the size of
    the schema's tables, see database_bytes)."""

    max_sessions: int = 0
    max_messages: int = 0
    max_bytes: int = 0
    max_database_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_messages", "max_bytes", "max_database_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be non-negative (0: no limit), got {getattr(self, name)}")


class QuotaExceeded(Exception):
    """A write would take an owner or the database past a limit; `limit_name` is the setting, `limit` its value."""

    def __init__(self, message: str, *, limit_name: str, limit: int, database: bool = False) -> None:
        super().__init__(message)
        self.limit_name = limit_name
        self.limit = limit
        self.database = database  # True: the whole database is full (507), not one owner (403)


QUOTA_KEY = (
    "pagedchat.quota"  # where a transaction's Session.info carries the database's quota (app/db/threads.py)
)


def quota_of(s: Session) -> StorageQuota:
    """The quota of the database this transaction runs on."""
    return s.info.get(QUOTA_KEY) or StorageQuota()


# every table of the schema pagedchat uses, with its indexes and TOAST data
_PG_TABLES_BYTES = text(
    "SELECT coalesce(sum(pg_total_relation_size(oid)), 0) FROM pg_class "
    "WHERE relkind = 'r' AND relnamespace = current_schema()::regnamespace"
)


def database_bytes(s: Session) -> int | None:
    """Bytes of the pages the SQLite database uses (free pages left by deletions are reused, so not counted);
    PostgreSQL: the on-disk size of the schema's tables with their indexes and TOAST (space that deletions free is
    reused by later rows but leaves the files only with VACUUM FULL); None on other backends."""
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        return int(s.execute(_PG_TABLES_BYTES).scalar_one())
    if dialect != "sqlite":
        return None
    page_count = s.execute(text("PRAGMA page_count")).scalar_one()
    free_pages = s.execute(text("PRAGMA freelist_count")).scalar_one()
    page_size = s.execute(text("PRAGMA page_size")).scalar_one()
    return (int(page_count) - int(free_pages)) * int(page_size)


def check_room(
    s: Session,
    quota: StorageQuota,
    owner: str,
    *,
    new_sessions: int = 0,
    new_messages: int = 0,
    new_bytes: int = 0,
) -> None:
    """Raise QuotaExceeded when adding this much would pass one of `quota`'s limits (nothing added: no check)."""
    if new_sessions <= 0 and new_messages <= 0 and new_bytes <= 0:
        return
    if quota.max_database_bytes:
        used = database_bytes(s)
        if used is not None and used >= quota.max_database_bytes:
            raise QuotaExceeded(
                f"the database is full: it holds {used} bytes, at its limit of {quota.max_database_bytes} bytes "
                "(max_database_bytes); no new sessions or messages until the operator raises it or frees space",
                limit_name="max_database_bytes",
                limit=quota.max_database_bytes,
                database=True,
            )
    if not (quota.max_sessions or quota.max_messages or quota.max_bytes):
        return
    usage = usage_of(s, owner)
    checks = (
        ("max_sessions_per_owner", quota.max_sessions, usage.num_sessions, new_sessions, "sessions"),
        ("max_messages_per_owner", quota.max_messages, usage.num_messages, new_messages, "messages"),
        ("max_bytes_per_owner", quota.max_bytes, usage.num_bytes, new_bytes, "bytes of text"),
    )
    for name, limit, used, adding, what in checks:
        if limit and adding > 0 and used + adding > limit:
            raise QuotaExceeded(
                f"storage quota reached: you keep {used} {what} and this needs {adding} more, over the limit "
                f"of {limit} {what} per owner ({name}); delete sessions to make room",
                limit_name=name,
                limit=limit,
            )

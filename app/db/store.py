"""The async storage facade: database work runs off the event loop (app/db/threads.py), reads apart from writes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from app.db import admin_sessions, queries, search
from app.db.account_store import AccountStore
from app.db.database import DEFAULT_BUSY_TIMEOUT_MS
from app.db.models import FINAL_ASSISTANT_STATUSES, ROLES, MessageStatus, utcnow
from app.db.preset_store import PresetMethods
from app.db.presets import PresetRef
from app.db.quota import StorageQuota, database_bytes
from app.db.records import MessageRecord, SessionRecord, check_owner, check_settings, check_text, storable
from app.db.threads import StoreThreads
from app.db.tree import MessageTree, Parent
from app.db.usage import UsageLedger

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_TITLE_CHARS = 200


class Store(PresetMethods, AccountStore, StoreThreads):
    """Sessions, messages, presets (PresetMethods), admin sign-ins and accounts (app/db/account_store.py) in a SQL
    database (SQLite in WAL mode by default); records out, never
    ORM objects.

    Owner-scoped calls treat another owner's session as missing (None / False). Database failures raise
    StoreUnavailable; bad arguments raise ValueError; calls before `start()` or after `close()` raise RuntimeError.
    Every write is committed before its call returns. `start()` migrates to head, then marks assistant rows left
    'streaming' by a previous process as 'interrupted'. Writes a client asks for (a session, a rename, a user
    message, room for a regenerated reply) are checked against `quota` and raise QuotaExceeded past it; replies are
    not (they must be stored: their room was checked before they started).
    """

    def __init__(
        self, url: str, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, quota: StorageQuota | None = None
    ) -> None:
        super().__init__(url, busy_timeout_ms=busy_timeout_ms)
        self.quota = quota or StorageQuota()
        owner_limits = (self.quota.max_sessions, self.quota.max_messages, self.quota.max_bytes)
        self._usage = UsageLedger() if any(owner_limits) else None  # writer thread only

    async def database_bytes(self) -> int | None:
        """Bytes the database uses as `max_database_bytes` counts them (SQLite: pages in use; PostgreSQL: the
        tables' size; None elsewhere)."""
        return await self._read(database_bytes)

    async def create_session(
        self,
        owner: str,
        *,
        title: str = "New chat",
        system_prompt: str = "",
        settings: dict[str, Any] | None = None,
        preset_id: str | None | PresetRef = None,
    ) -> SessionRecord:
        """Create an empty session for `owner`, following `preset_id` (one of the owner's presets; OWNER_DEFAULT:
        its default preset, if any; ValueError for another owner's)."""
        check_owner(owner)
        _check_title(title)
        check_text("system_prompt", system_prompt)
        check_settings(settings)
        return await self._tx(
            queries.create_session, owner, title, system_prompt, dict(settings or {}), self.quota, preset_id
        )

    async def list_sessions(self, owner: str) -> list[SessionRecord]:
        """The owner's sessions, most recently updated first."""
        return await self._read(queries.list_sessions, owner)

    async def get_session(self, owner: str, session_id: str) -> SessionRecord | None:
        """The session, or None when it does not exist or belongs to someone else."""
        return await self._read(queries.get_session, owner, session_id)

    async def update_session(
        self,
        owner: str,
        session_id: str,
        *,
        title: str | None = None,
        system_prompt: str | None = None,
        settings: dict[str, Any] | None = None,
        preset_id: str | None | PresetRef = PresetRef.KEEP,
    ) -> SessionRecord | None:
        """Change the fields given (settings are replaced whole; preset_id None: no preset); None when the session
        is missing."""
        changes: dict[str, Any] = {}
        if preset_id is not PresetRef.KEEP:
            changes["preset_id"] = preset_id
        if title is not None:
            _check_title(title)
            changes["title"] = title
        if system_prompt is not None:
            check_text("system_prompt", system_prompt)
            changes["system_prompt"] = system_prompt
        if settings is not None:
            check_settings(settings)
            changes["settings"] = dict(settings)
        return await self._tx(queries.update_session, owner, session_id, changes, self.quota)

    async def delete_session(self, owner: str, session_id: str) -> bool:
        """Delete the session and (by cascade) its messages; False when it is missing."""
        return await self._tx(queries.delete_session, owner, session_id)

    async def list_messages(self, owner: str, session_id: str) -> list[MessageRecord] | None:
        """The session's active path (the branch on show) in order, or None when the session is missing."""
        return await self._read(queries.list_messages, owner, session_id)

    async def get_tree(self, owner: str, session_id: str) -> MessageTree | None:
        """Every message of the session and its active leaf, or None when the session is missing."""
        return await self._read(queries.get_tree, owner, session_id)

    async def switch_branch(self, owner: str, session_id: str, message_id: int) -> MessageTree | None:
        """Show the branch through `message_id` (its newest continuation becomes the active leaf); None when the
        session is missing, ValueError when the message is not in it."""
        return await self._tx(queries.switch_branch, owner, session_id, message_id)

    async def search_messages(
        self, owner: str, text: str, *, limit: int = 20, offset: int = 0
    ) -> search.SearchPage:
        """The owner's chats whose messages match `text` (words, "phrases", the last word as a prefix), best first;
        ValueError for a search with no words or past its limits, SearchUnsupported on a database without an
        implementation."""
        return await self._read(search.search_messages, owner, text, limit, offset)

    async def add_message(
        self,
        session_id: str,
        role: str,
        content: str,
        *,
        token_ids: list[int] | None = None,
        status: MessageStatus = MessageStatus.COMPLETE,
        parent_id: int | None | Parent = Parent.ACTIVE_LEAF,
    ) -> MessageRecord:
        """Add a message after `parent_id` (default: the active leaf; None: a first message, beside any other)
        and make it the active leaf (committed on return); LookupError when the session does not exist,
        ValueError when the parent is not one of its messages.

        A user message must fit the quota together with its reply (QuotaExceeded otherwise).
        """
        values = _message_values(role, content, token_ids, status)
        quota = self.quota if role == "user" else None
        return await self._tx(queries.add_message, session_id, values, quota, parent_id)

    async def check_reply_room(self, session_id: str) -> None:
        """Before a new version of a reply (regenerate): QuotaExceeded when the owner has no room for one more
        message. A new user message makes room for its reply; a regenerate adds a reply and keeps the old one."""
        if self.quota.max_messages or self.quota.max_database_bytes:  # the limits a message counts against
            await self._tx(queries.check_reply_room, session_id, self.quota)

    async def start_assistant(
        self,
        session_id: str,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        truncated_turns: int,
        tokenizer_fingerprint: str,
        parent_id: int | None | Parent = Parent.ACTIVE_LEAF,
    ) -> MessageRecord:
        """Add an empty assistant message in state 'streaming' after `parent_id` (default: the active leaf);
        LookupError when the session does not exist."""
        values = dict(
            role="assistant",
            content="",
            status=MessageStatus.STREAMING.value,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            truncated_turns=truncated_turns,
            tokenizer_fingerprint=tokenizer_fingerprint,
        )
        return await self._tx(queries.add_message, session_id, values, None, parent_id)

    async def resume_assistant(
        self,
        message_id: int,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        truncated_turns: int,
        tokenizer_fingerprint: str,
    ) -> MessageRecord:
        """Continue an answer: back to 'streaming' with the new request's prompt figures, its text kept (flushes
        and the final write then carry the whole text); LookupError when it was deleted."""
        values = dict(
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            truncated_turns=truncated_turns,
            tokenizer_fingerprint=tokenizer_fingerprint,
        )
        return await self._tx(queries.resume_assistant, message_id, values)

    async def flush_assistant(self, message_id: int, content: str) -> None:
        """Save the partial text of a streaming answer (no-op once it finished or was deleted)."""
        await self._tx(queries.flush_assistant, message_id, storable(content))

    async def finish_assistant(
        self,
        message_id: int,
        *,
        content: str,
        status: MessageStatus,
        finish_reason: str | None,
        token_ids: list[int],
        completion_tokens: int,
        timings: dict[str, float],
        error: str | None = None,
    ) -> None:
        """Record the final answer (no-op when its session was deleted meanwhile)."""
        if status not in FINAL_ASSISTANT_STATUSES:
            raise ValueError(f"status must be one of {FINAL_ASSISTANT_STATUSES}, got {str(status)!r}")
        values = dict(
            content=storable(content),
            status=MessageStatus(status).value,
            finish_reason=finish_reason,
            token_ids=[int(t) for t in token_ids],
            completion_tokens=completion_tokens,
            timings=dict(timings),
            error=None if error is None else storable(error),
        )
        await self._tx(queries.finish_assistant, message_id, values)

    async def delete_messages_from(self, session_id: str, message_id: int) -> int:
        """Delete this message and the branches below it; returns how many messages went."""
        return await self._tx(queries.delete_messages_from, session_id, message_id)

    # -- admin sign-ins: the cookie holds a secret, the row its SHA-256 (`session_hash`) ------------------------

    async def create_admin_session(
        self, session_hash: str, token_fingerprint: str, client: str | None, lifetime_s: float
    ) -> None:
        """Record a sign-in, valid for `lifetime_s` unless revoked."""
        expires_at = utcnow() + timedelta(seconds=lifetime_s)
        await self._tx(
            admin_sessions.create, session_hash, token_fingerprint, (client or "")[:64], expires_at
        )

    async def admin_session_valid(self, session_hash: str, token_fingerprint: str) -> bool:
        """True for an unexpired, unrevoked sign-in made with the admin token of this fingerprint."""
        return await self._read(admin_sessions.is_valid, session_hash, token_fingerprint)

    async def revoke_admin_session(self, session_hash: str) -> bool:
        """Sign out; False when there was no such live sign-in."""
        return await self._tx(admin_sessions.revoke, session_hash)

    async def revoke_admin_sessions_except(self, token_fingerprint: str | None) -> int:
        """Revoke the sign-ins made with another admin token (every one when None); drop expired ones."""
        return await self._tx(admin_sessions.revoke_all_except, token_fingerprint)

    async def _tx(self, fn: Callable[..., T], *args: Any) -> T:
        """A write on the writer thread; what it changes of an owner's usage joins the running figures once
        committed."""
        return await self._call(self._write_transaction, fn, *args)

    def _write_transaction(self, fn: Callable[..., T], *args: Any) -> T:
        if self._usage is None:
            return self._in_transaction(fn, *args)
        if self._sessions is None:
            raise RuntimeError("Store is not running: await store.start() first (and not after close())")
        with self._sessions.begin() as s:
            self._usage.begin(s)
            result = fn(s, *args)
        self._usage.commit(s)  # committed: what the writes noted joins the running figures
        return result

    def _prepare(self, s: Session) -> None:
        num_interrupted = queries.mark_streaming_interrupted(s)
        if num_interrupted:
            logger.warning(
                "marked %d answers left streaming by a previous run as interrupted", num_interrupted
            )


def _message_values(
    role: str, content: str, token_ids: list[int] | None, status: MessageStatus
) -> dict[str, Any]:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    assistant = (MessageStatus.STREAMING.value, *FINAL_ASSISTANT_STATUSES)
    allowed = assistant if role == "assistant" else (MessageStatus.COMPLETE.value,)
    if status not in allowed:
        raise ValueError(f"status of a {role} message must be one of {allowed}, got {str(status)!r}")
    check_text("content", content)
    ids = None if token_ids is None else [int(t) for t in token_ids]
    return dict(role=role, content=content, token_ids=ids, status=MessageStatus(status).value)


def _check_title(title: str) -> None:
    if not isinstance(title, str) or len(title) > MAX_TITLE_CHARS:
        raise ValueError(f"title must be a string of at most {MAX_TITLE_CHARS} characters, got {title!r:.40}")
    check_text("title", title)

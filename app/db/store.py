"""The async storage facade: every database call runs on one worker thread, so the event loop never blocks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Engine, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.db import queries
from app.db.database import DEFAULT_BUSY_TIMEOUT_MS, create_db_engine, upgrade_to_head
from app.db.models import FINAL_ASSISTANT_STATUSES, ROLES, MessageStatus
from app.db.quota import StorageQuota, database_bytes
from app.db.records import MessageRecord, SessionRecord, StoreUnavailable
from app.db.usage import UsageLedger

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_TITLE_CHARS = 200
MAX_OWNER_CHARS = 128


class Store:
    """Sessions and messages in a SQL database (SQLite in WAL mode by default); records out, never ORM objects.

    Owner-scoped calls treat another owner's session as missing (None / False). Database failures raise
    StoreUnavailable; bad arguments raise ValueError; calls before `start()` or after `close()` raise RuntimeError.
    Every write is committed before its call returns. Writes a client asks for (a session, a rename, a user
    message) are checked against `quota` and raise QuotaExceeded past it; replies are not (they must be stored).
    """

    def __init__(
        self, url: str, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, quota: StorageQuota | None = None
    ) -> None:
        self.url = url
        self.quota = quota or StorageQuota()
        owner_limits = (self.quota.max_sessions, self.quota.max_messages, self.quota.max_bytes)
        self._usage = UsageLedger() if any(owner_limits) else None  # worker thread only
        self._busy_timeout_ms = busy_timeout_ms
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Migrate to head, then mark assistant rows left 'streaming' by a previous process as 'interrupted'."""
        if self._executor is not None:
            raise RuntimeError("Store.start() called twice")
        # One thread: SQLite has one writer anyway, and writes land in the order they were awaited.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedchat-store")
        try:
            await self._call(self._open)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Dispose of the connection pool and stop the worker thread; safe to call twice."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        engine, self._engine, self._sessions = self._engine, None, None
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(executor, engine.dispose)
        executor.shutdown(wait=True)

    async def ping(self) -> None:
        """Raise StoreUnavailable when the database cannot be read."""
        await self._call(self._ping)

    async def database_bytes(self) -> int | None:
        """Bytes of the pages the database uses (SQLite; None elsewhere), as `max_database_bytes` counts them."""
        return await self._tx(database_bytes)

    async def create_session(
        self,
        owner: str,
        *,
        title: str = "New chat",
        system_prompt: str = "",
        settings: dict[str, Any] | None = None,
    ) -> SessionRecord:
        """Create an empty session for `owner`."""
        _check_owner(owner)
        _check_title(title)
        _check_settings(settings)
        return await self._tx(
            queries.create_session, owner, title, system_prompt, dict(settings or {}), self.quota
        )

    async def list_sessions(self, owner: str) -> list[SessionRecord]:
        """The owner's sessions, most recently updated first."""
        return await self._tx(queries.list_sessions, owner)

    async def get_session(self, owner: str, session_id: str) -> SessionRecord | None:
        """The session, or None when it does not exist or belongs to someone else."""
        return await self._tx(queries.get_session, owner, session_id)

    async def update_session(
        self,
        owner: str,
        session_id: str,
        *,
        title: str | None = None,
        system_prompt: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> SessionRecord | None:
        """Change the fields given (settings are replaced whole); None when the session is missing."""
        changes: dict[str, Any] = {}
        if title is not None:
            _check_title(title)
            changes["title"] = title
        if system_prompt is not None:
            changes["system_prompt"] = system_prompt
        if settings is not None:
            _check_settings(settings)
            changes["settings"] = dict(settings)
        return await self._tx(queries.update_session, owner, session_id, changes, self.quota)

    async def delete_session(self, owner: str, session_id: str) -> bool:
        """Delete the session and (by cascade) its messages; False when it is missing."""
        return await self._tx(queries.delete_session, owner, session_id)

    async def list_messages(self, owner: str, session_id: str) -> list[MessageRecord] | None:
        """The session's messages in order, or None when the session is missing."""
        return await self._tx(queries.list_messages, owner, session_id)

    async def add_message(
        self,
        session_id: str,
        role: str,
        content: str,
        *,
        token_ids: list[int] | None = None,
        status: MessageStatus = MessageStatus.COMPLETE,
    ) -> MessageRecord:
        """Append a message (committed on return); LookupError when the session does not exist.

        A user message must fit the quota together with its reply (QuotaExceeded otherwise).
        """
        values = _message_values(role, content, token_ids, status)
        quota = self.quota if role == "user" else None
        return await self._tx(queries.add_message, session_id, values, quota)

    async def replace_messages_from(
        self, session_id: str, message_id: int, content: str, *, token_ids: list[int] | None = None
    ) -> MessageRecord:
        """Edit / regenerate in one transaction: delete this message and every later one, append a user message
        in their place (quota-checked as in `add_message`; a refusal leaves the session unchanged)."""
        values = _message_values("user", content, token_ids, MessageStatus.COMPLETE)
        return await self._tx(queries.replace_messages_from, session_id, message_id, values, self.quota)

    async def start_assistant(
        self,
        session_id: str,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        truncated_turns: int,
        tokenizer_fingerprint: str,
    ) -> MessageRecord:
        """Append an empty assistant message in state 'streaming'; LookupError when the session does not exist."""
        values = dict(
            role="assistant",
            content="",
            status=MessageStatus.STREAMING.value,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            truncated_turns=truncated_turns,
            tokenizer_fingerprint=tokenizer_fingerprint,
        )
        return await self._tx(queries.add_message, session_id, values)

    async def flush_assistant(self, message_id: int, content: str) -> None:
        """Save the partial text of a streaming answer (no-op once it finished or was deleted)."""
        await self._tx(queries.flush_assistant, message_id, content)

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
            content=content,
            status=MessageStatus(status).value,
            finish_reason=finish_reason,
            token_ids=[int(t) for t in token_ids],
            completion_tokens=completion_tokens,
            timings=dict(timings),
            error=error,
        )
        await self._tx(queries.finish_assistant, message_id, values)

    async def delete_messages_from(self, session_id: str, message_id: int) -> int:
        """Delete this message and every later one of the session (regenerate / edit); returns how many."""
        return await self._tx(queries.delete_messages_from, session_id, message_id)

    # -- plumbing: everything below runs on the worker thread, except the awaiting in `_call` -----------------

    async def _tx(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(session, *args)` in one transaction on the worker thread, committed before returning."""
        return await self._call(self._in_transaction, fn, *args)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise RuntimeError("Store is not running: await store.start() first (and not after close())")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except sa_exc.IntegrityError:
            raise  # a constraint the store checks first: a bug, not an outage
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            cause = getattr(exc, "orig", None) or exc
            raise StoreUnavailable(f"database unavailable ({self._safe_url()}): {cause}") from exc

    def _in_transaction(self, fn: Callable[..., T], *args: Any) -> T:
        if self._sessions is None:
            raise RuntimeError("Store is not running: await store.start() first (and not after close())")
        with self._sessions.begin() as s:
            if self._usage is not None:
                self._usage.begin(s)
            result = fn(s, *args)
        if self._usage is not None:  # committed: what the writes noted joins the running figures
            self._usage.commit(s)
        return result

    def _open(self) -> None:
        engine = create_db_engine(self.url, busy_timeout_ms=self._busy_timeout_ms)
        try:
            upgrade_to_head(engine)
            sessions = sessionmaker(engine, expire_on_commit=False)
            with sessions.begin() as s:
                num_interrupted = queries.mark_streaming_interrupted(s)
        except BaseException:
            engine.dispose()
            raise
        if num_interrupted:
            logger.warning(
                "marked %d answers left streaming by a previous run as interrupted", num_interrupted
            )
        self._engine, self._sessions = engine, sessions

    def _ping(self) -> None:
        if self._engine is None:
            raise RuntimeError("Store is not running: await store.start() first (and not after close())")
        with self._engine.connect() as conn:
            conn.execute(text("SELECT version_num FROM alembic_version")).all()

    def _safe_url(self) -> str:
        try:
            return make_url(self.url).render_as_string(hide_password=True)
        except sa_exc.ArgumentError:
            return "<invalid url>"


def _message_values(
    role: str, content: str, token_ids: list[int] | None, status: MessageStatus
) -> dict[str, Any]:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    assistant = (MessageStatus.STREAMING.value, *FINAL_ASSISTANT_STATUSES)
    allowed = assistant if role == "assistant" else (MessageStatus.COMPLETE.value,)
    if status not in allowed:
        raise ValueError(f"status of a {role} message must be one of {allowed}, got {str(status)!r}")
    ids = None if token_ids is None else [int(t) for t in token_ids]
    return dict(role=role, content=content, token_ids=ids, status=MessageStatus(status).value)


def _check_owner(owner: str) -> None:
    if not isinstance(owner, str) or not 0 < len(owner) <= MAX_OWNER_CHARS:
        raise ValueError(f"owner must be a string of 1 to {MAX_OWNER_CHARS} characters, got {owner!r:.40}")


def _check_title(title: str) -> None:
    if not isinstance(title, str) or len(title) > MAX_TITLE_CHARS:
        raise ValueError(f"title must be a string of at most {MAX_TITLE_CHARS} characters, got {title!r:.40}")


def _check_settings(settings: dict[str, Any] | None) -> None:
    if settings is not None and not isinstance(settings, dict):
        raise ValueError(f"settings must be a dict, got {type(settings).__name__}")

"""SQLAlchemy 2.0 declarative models: chat sessions, their messages (text and the token ids the model saw) as a tree
of branches, the presets that chats start from, and admin sign-ins."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

ROLES = ("system", "user", "assistant")


class MessageStatus(str, Enum):
    """A message's state as stored and as the API shows it (the values are the database's and the JSON's)."""

    COMPLETE = "complete"  # a user or system message
    STREAMING = "streaming"  # an assistant message being generated; it ends in one of the states below
    FINISHED = "finished"  # the model ended it (EOS, stop string, max_tokens)
    STOPPED = "stopped"  # the user stopped it
    FAILED = "failed"  # the engine or the service failed it; `error` says why
    INTERRUPTED = "interrupted"  # its client went away, or the server shut down or died while it streamed

    def __str__(self) -> str:
        return self.value


FINAL_ASSISTANT_STATUSES = tuple(
    s.value
    for s in (MessageStatus.FINISHED, MessageStatus.STOPPED, MessageStatus.FAILED, MessageStatus.INTERRUPTED)
)
STATUSES = tuple(s.value for s in MessageStatus)  # plain strings: the CHECK constraint spells them out

# Deterministic constraint names, so that migrations can name (and later drop or alter) them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def expires_in(lifetime_s: float) -> datetime:
    """When something made now with this lifetime expires."""
    return utcnow() + timedelta(seconds=lifetime_s)


def new_session_id() -> str:
    """An unguessable session id (128 random bits, URL-safe)."""
    return secrets.token_urlsafe(16)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    """Declarative base whose metadata Alembic compares against the migrations."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ChatSession(Base):
    """One conversation owned by a browser cookie id or an API-key fingerprint."""

    __tablename__ = "chat_sessions"
    __table_args__ = (Index("ix_chat_sessions_owner_updated_at", "owner", "updated_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_session_id)
    owner: Mapped[str] = mapped_column(String(128))
    title: Mapped[str] = mapped_column(String(200))
    system_prompt: Mapped[str] = mapped_column(Text)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)  # temperature, top_p, max_tokens, ...
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # the owner's preset whose values fill in what the chat leaves unset. No foreign key on purpose: SQLite can add
    # and drop a plain column in place, while a constraint means copying the table, and dropping the old copy
    # would cascade-delete every message; deleting a preset clears it here in the same transaction instead.
    preset_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The last message of the branch on show (the page's and the next turn's default). Not a foreign key: it would
    # make a cycle with messages.session_id; the store keeps it on a message of this session, and readers take the
    # newest message where it is missing (app/db/tree.py).
    active_leaf_id: Mapped[int | None] = mapped_column(Integer, nullable=True)

    messages: Mapped[list[Message]] = relationship(
        back_populates="session",
        cascade="all, delete-orphan",
        passive_deletes=True,  # the database's ON DELETE CASCADE removes the rows
        order_by="Message.position",
    )


class Message(Base):
    """One turn of a session, a node of its tree: `parent_id` is the turn it follows (None: a first message), so
    regenerated replies and edited messages are siblings. `position` is the order of creation within the session
    (a parent always comes before its children); `token_ids` holds what the model saw or produced."""

    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "position"),
        CheckConstraint(_in("role", ROLES), name="role"),
        CheckConstraint(_in("status", STATUSES), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    # user: the ids this turn's rendering appended to the prompt; assistant: the answer's ids as generated.
    token_ids: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cached_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    truncated_turns: Mapped[int | None] = mapped_column(Integer, nullable=True)
    timings: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)  # ttft, total, tokens_per_s
    tokenizer_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # deleting a message deletes the branch below it
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), nullable=True, index=True
    )

    session: Mapped[ChatSession] = relationship(back_populates="messages")


class Preset(Base):
    """A named system prompt and sampling settings of one owner; at most one per owner is its default, which new
    chats start from."""

    __tablename__ = "presets"
    __table_args__ = (
        UniqueConstraint("owner", "name"),
        # the database holds "one default per owner" itself (a partial unique index; SQLite and PostgreSQL)
        Index(
            "ix_presets_owner_default",
            "owner",
            unique=True,
            sqlite_where=text("is_default"),
            postgresql_where=text("is_default"),
        ),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_session_id)
    owner: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(100))
    system_prompt: Mapped[str] = mapped_column(Text)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)  # the same keys as a chat's settings
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AdminSession(Base):
    """A signed-in admin page. Its cookie holds a random secret whose SHA-256 is the id (the table alone signs no
    one in); it ends when it expires, on sign-out, or when the server starts with another admin token."""

    __tablename__ = "admin_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # a keyed digest of the admin token it was signed in with (app/http/admin_auth.py), never the token
    token_fingerprint: Mapped[str] = mapped_column(String(64))
    client: Mapped[str] = mapped_column(String(64))  # the address that signed in
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class SystemPromptChange(Base):
    """A chat's system prompt replaced after some of its turns: `previous` is the prompt that was in effect until
    `created_at` (the new one is the next change's `previous`, or the session's own for the last change). Changes
    with no turn between them are one change (app/db/prompt_history.py)."""

    __tablename__ = "system_prompt_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("chat_sessions.id", ondelete="CASCADE"), index=True)
    previous: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

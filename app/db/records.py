"""Plain frozen records the store hands out (never ORM objects), and the store's error types."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from app.db.models import Attachment, ChatSession, Message, MessageStatus, Preset

MAX_OWNER_CHARS = 128


class StoreUnavailable(Exception):
    """The database cannot be reached or written (locked past busy_timeout, unreachable, disk I/O)."""


class PresetNameTaken(Exception):
    """The owner already has a preset of that name (names are unique per owner)."""


@dataclass(frozen=True)
class SessionRecord:
    """A chat session as stored."""

    id: str
    owner: str
    title: str
    system_prompt: str
    settings: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    preset_id: str | None = None  # the preset filling in what `settings` and `system_prompt` leave unset


@dataclass(frozen=True)
class PresetRecord:
    """A preset as stored: a named system prompt and sampling settings of one owner."""

    id: str
    owner: str
    name: str
    system_prompt: str
    settings: dict[str, Any]
    is_default: bool
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class AttachmentRecord:
    """A file attached to a chat as stored: its extracted `text` is what a prompt carries; `message_id` None: not
    sent yet."""

    id: int
    session_id: str
    message_id: int | None
    filename: str
    media_type: str
    num_bytes: int
    text: str
    num_tokens: int
    created_at: datetime


@dataclass(frozen=True)
class MessageRecord:
    """One message of a session as stored; `token_ids` is None where no ids were recorded; `parent_id` is the
    message it follows (None: a first message)."""

    id: int
    session_id: str
    parent_id: int | None
    position: int
    role: str
    content: str
    token_ids: tuple[int, ...] | None
    status: MessageStatus
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    truncated_turns: int | None
    timings: dict[str, float] | None
    tokenizer_fingerprint: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    attachments: tuple[AttachmentRecord, ...] = ()  # a user message's files, in the order they were attached


def as_utc(value: datetime) -> datetime:
    """A datetime read back from the database, made timezone-aware (UTC)."""
    # SQLite hands back naive datetimes, everything being written in UTC; PostgreSQL aware ones in the session's
    # time zone (UTC as the store connects, but a server may say otherwise)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def session_record(row: ChatSession) -> SessionRecord:
    """Copy an ORM session into a record."""
    return SessionRecord(
        id=row.id,
        owner=row.owner,
        title=row.title,
        system_prompt=row.system_prompt,
        settings=dict(row.settings),
        created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
        preset_id=row.preset_id,
    )


def preset_record(row: Preset) -> PresetRecord:
    """Copy an ORM preset into a record."""
    return PresetRecord(
        id=row.id,
        owner=row.owner,
        name=row.name,
        system_prompt=row.system_prompt,
        settings=dict(row.settings),
        is_default=bool(row.is_default),
        created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
    )


def attachment_record(row: Attachment) -> AttachmentRecord:
    """Copy an ORM attachment into a record."""
    return AttachmentRecord(
        id=row.id,
        session_id=row.session_id,
        message_id=row.message_id,
        filename=row.filename,
        media_type=row.media_type,
        num_bytes=row.num_bytes,
        text=row.text,
        num_tokens=row.num_tokens,
        created_at=as_utc(row.created_at),
    )


def message_record(row: Message, attachments: tuple[AttachmentRecord, ...] = ()) -> MessageRecord:
    """Copy an ORM message (and the records of its attachments) into a record."""
    return MessageRecord(
        id=row.id,
        session_id=row.session_id,
        parent_id=row.parent_id,
        position=row.position,
        role=row.role,
        content=row.content,
        token_ids=None if row.token_ids is None else tuple(row.token_ids),
        status=MessageStatus(row.status),
        finish_reason=row.finish_reason,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        cached_tokens=row.cached_tokens,
        truncated_turns=row.truncated_turns,
        timings=None if row.timings is None else dict(row.timings),
        tokenizer_fingerprint=row.tokenizer_fingerprint,
        error=row.error,
        created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
        attachments=attachments,
    )


def check_owner(owner: str) -> None:
    """ValueError unless `owner` fits the owner columns."""
    if not isinstance(owner, str) or not 0 < len(owner) <= MAX_OWNER_CHARS:
        raise ValueError(f"owner must be a string of 1 to {MAX_OWNER_CHARS} characters, got {owner!r:.40}")


def check_text(name: str, value: str | None) -> None:
    """ValueError when `value` holds a NUL character: PostgreSQL's text cannot store one, so no backend takes it."""
    if value is not None and "\x00" in value:
        raise ValueError(
            f"{name} must not contain NUL characters (U+0000), found at index {value.index(chr(0))}"
        )


def storable(value: str) -> str:
    """Model output as the store keeps it: NUL characters (a model may emit byte 0, which PostgreSQL's text cannot
    hold) become U+FFFD, on every backend alike."""
    return value.replace("\x00", "\ufffd")


def check_settings(settings: dict[str, Any] | None) -> None:
    """ValueError unless `settings` is a dict (or None)."""
    if settings is not None and not isinstance(settings, dict):
        raise ValueError(f"settings must be a dict, got {type(settings).__name__}")


def prompt_changes(system_prompt: str | None, settings: dict[str, Any] | None) -> dict[str, Any]:
    """An update's system prompt and settings (replaced whole), each checked; the ones given only."""
    changes: dict[str, Any] = {}
    if system_prompt is not None:
        check_text("system_prompt", system_prompt)
        changes["system_prompt"] = system_prompt
    if settings is not None:
        check_settings(settings)
        changes["settings"] = dict(settings)
    return changes

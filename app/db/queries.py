"""The synchronous database work behind `Store`: one function per operation, each given an ORM session."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.db.models import ChatSession, Message, MessageStatus, utcnow
from app.db.presets import PresetRef, session_preset_id
from app.db.quota import StorageQuota, check_room
from app.db.records import MessageRecord, SessionRecord, message_record, session_record
from app.db.usage import forget, nbytes, note, text_bytes, tracking

logger = logging.getLogger(__name__)


def _owned(s: Session, owner: str, session_id: str) -> ChatSession | None:
    row = s.get(ChatSession, session_id)
    return row if row is not None and row.owner == owner else None


def mark_streaming_interrupted(s: Session) -> int:
    """Mark assistant rows still 'streaming' (left by a process that died) as 'interrupted'; returns how many."""
    query = (
        update(Message)
        .where(Message.status == MessageStatus.STREAMING.value)
        .values(status=MessageStatus.INTERRUPTED.value, updated_at=utcnow())
    )
    return s.execute(query).rowcount


def create_session(
    s: Session,
    owner: str,
    title: str,
    system_prompt: str,
    settings: dict[str, Any],
    quota: StorageQuota,
    preset_id: str | None | PresetRef = None,
) -> SessionRecord:
    """Insert a session (QuotaExceeded when the owner or the database has no room for it), following `preset_id`
    (OWNER_DEFAULT: the owner's default preset, if any)."""
    preset_id = session_preset_id(s, owner, preset_id)
    check_room(s, quota, owner, new_sessions=1, new_bytes=text_bytes(title, system_prompt))
    now = utcnow()
    row = ChatSession(
        owner=owner, title=title, system_prompt=system_prompt, settings=settings, preset_id=preset_id
    )
    row.created_at = row.updated_at = now
    s.add(row)
    s.flush()
    note(s, owner, sessions=1, nbytes=text_bytes(title, system_prompt))
    return session_record(row)


def list_sessions(s: Session, owner: str) -> list[SessionRecord]:
    """The owner's sessions, most recently updated first."""
    query = (
        select(ChatSession)
        .where(ChatSession.owner == owner)
        .order_by(ChatSession.updated_at.desc(), ChatSession.created_at.desc(), ChatSession.id)
    )
    return [session_record(row) for row in s.scalars(query)]


def get_session(s: Session, owner: str, session_id: str) -> SessionRecord | None:
    """The owner's session, or None."""
    row = _owned(s, owner, session_id)
    return None if row is None else session_record(row)


def update_session(
    s: Session, owner: str, session_id: str, changes: dict[str, Any], quota: StorageQuota
) -> SessionRecord | None:
    """Apply `changes` (column -> value) to the owner's session; None when it is missing; QuotaExceeded when
    longer text would not fit; ValueError when `preset_id` is not one of the owner's presets."""
    row = _owned(s, owner, session_id)
    if row is None:
        return None
    if "preset_id" in changes:
        changes = {**changes, "preset_id": session_preset_id(s, owner, changes["preset_id"])}
    grown = sum(
        text_bytes(changes[key]) - text_bytes(getattr(row, key))
        for key in ("title", "system_prompt")
        if key in changes
    )
    check_room(s, quota, owner, new_bytes=grown)
    for key, value in changes.items():
        setattr(row, key, value)
    row.updated_at = utcnow()
    s.flush()
    note(s, owner, nbytes=grown)
    return session_record(row)


def delete_session(s: Session, owner: str, session_id: str) -> bool:
    """Delete the owner's session; the database cascades to its messages."""
    row = _owned(s, owner, session_id)
    if row is None:
        return False
    s.delete(row)
    forget(s, owner)
    return True


def list_messages(s: Session, owner: str, session_id: str) -> list[MessageRecord] | None:
    """The messages of the owner's session in order, or None when it is missing."""
    if _owned(s, owner, session_id) is None:
        return None
    query = select(Message).where(Message.session_id == session_id).order_by(Message.position)
    return [message_record(row) for row in s.scalars(query)]


def add_message(
    s: Session, session_id: str, values: dict[str, Any], quota: StorageQuota | None = None
) -> MessageRecord:
    """Append a message after the session's last one; LookupError when the session does not exist.

    With `quota`, the owner must have room for this message and the reply it asks for (QuotaExceeded otherwise).
    """
    parent = s.get(ChatSession, session_id)
    if parent is None:
        raise LookupError(f"session {session_id!r} does not exist")
    if quota is not None:
        check_room(s, quota, parent.owner, new_messages=2, new_bytes=text_bytes(values.get("content")))
    last = s.scalar(select(func.max(Message.position)).where(Message.session_id == session_id))
    now = utcnow()
    row = Message(session_id=session_id, position=0 if last is None else last + 1, **values)
    row.created_at = row.updated_at = now
    parent.updated_at = now
    s.add(row)
    s.flush()
    note(s, parent.owner, messages=1, nbytes=text_bytes(values.get("content")))
    return message_record(row)


def flush_assistant(s: Session, message_id: int, content: str) -> None:
    """Save a streaming answer's partial text; no-op once it left 'streaming' or was deleted."""
    if tracking(s):
        query_old = (
            select(nbytes(Message.content), ChatSession.owner)
            .join(ChatSession, Message.session_id == ChatSession.id)
            .where(Message.id == message_id, Message.status == MessageStatus.STREAMING.value)
        )
        found = s.execute(query_old).first()
        if found is not None:
            note(s, found.owner, nbytes=text_bytes(content) - found[0])
    query = (
        update(Message)
        .where(Message.id == message_id, Message.status == MessageStatus.STREAMING.value)
        .values(content=content, updated_at=utcnow())
    )
    s.execute(query)


def finish_assistant(s: Session, message_id: int, values: dict[str, Any]) -> None:
    """Write an answer's final fields; no-op when its session was deleted meanwhile."""
    row = s.get(Message, message_id)
    if row is None:
        logger.info("answer %d finished after its session was deleted", message_id)
        return
    if row.role != "assistant":
        raise RuntimeError(f"finish_assistant on message {message_id}, which is a {row.role} message")
    if "content" in values:
        note(s, row.session.owner, nbytes=text_bytes(values["content"]) - text_bytes(row.content))
    now = utcnow()
    for key, value in values.items():
        setattr(row, key, value)
    row.updated_at = now
    row.session.updated_at = now


def delete_messages_from(s: Session, session_id: str, message_id: int) -> int:
    """Delete the message and every later one of its session; 0 when it is not in that session."""
    first = s.get(Message, message_id)
    if first is None or first.session_id != session_id:
        return 0
    query = delete(Message).where(Message.session_id == session_id, Message.position >= first.position)
    deleted = s.execute(query).rowcount
    parent = s.get_one(ChatSession, session_id)
    parent.updated_at = utcnow()
    forget(s, parent.owner)
    return deleted


def replace_messages_from(
    s: Session, session_id: str, message_id: int, values: dict[str, Any], quota: StorageQuota | None
) -> MessageRecord:
    """Delete the message and every later one, then append a new one, in one transaction (edit / regenerate):
    a refused append (quota) leaves the conversation as it was."""
    delete_messages_from(s, session_id, message_id)
    return add_message(s, session_id, values, quota)

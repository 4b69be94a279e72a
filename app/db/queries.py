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
from app.db.tree import MessageTree, Parent
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


def get_tree(s: Session, owner: str, session_id: str) -> MessageTree | None:
    """Every message of the owner's session and its active leaf, or None when it is missing."""
    row = _owned(s, owner, session_id)
    if row is None:
        return None
    query = select(Message).where(Message.session_id == session_id).order_by(Message.position)
    return MessageTree(tuple(message_record(m) for m in s.scalars(query)), row.active_leaf_id)


def list_messages(s: Session, owner: str, session_id: str) -> list[MessageRecord] | None:
    """The active path of the owner's session in order, or None when it is missing."""
    tree = get_tree(s, owner, session_id)
    return None if tree is None else tree.active_path()


def switch_branch(s: Session, owner: str, session_id: str, message_id: int) -> MessageTree | None:
    """Show the branch through `message_id`: the active leaf becomes the newest message below it. None when the
    session is missing; ValueError when the message is not one of its messages."""
    tree = get_tree(s, owner, session_id)
    if tree is None:
        return None
    if message_id not in tree:
        raise ValueError(f"message {message_id} is not a message of session {session_id[:64]!r}")
    leaf_id = tree.newest_under(message_id)
    s.get_one(ChatSession, session_id).active_leaf_id = leaf_id
    return MessageTree(tree.messages, leaf_id)


def _active_leaf(s: Session, session: ChatSession) -> int | None:
    """The session's active leaf where it names one of its messages, else its newest message (None: empty)."""
    if session.active_leaf_id is not None:
        leaf = s.get(Message, session.active_leaf_id)
        if leaf is not None and leaf.session_id == session.id:
            return leaf.id
    newest = select(Message.id).where(Message.session_id == session.id).order_by(Message.position.desc())
    return s.scalar(newest.limit(1))


def add_message(
    s: Session,
    session_id: str,
    values: dict[str, Any],
    quota: StorageQuota | None = None,
    parent_id: int | None | Parent = Parent.ACTIVE_LEAF,
) -> MessageRecord:
    """Add a message after `parent_id` (None: a first message; default: the active leaf), which it then becomes
    the active leaf; LookupError when the session does not exist, ValueError when the parent is not in it.

    With `quota`, the owner must have room for this message and the reply it asks for (QuotaExceeded otherwise).
    """
    session = s.get(ChatSession, session_id)
    if session is None:
        raise LookupError(f"session {session_id!r} does not exist")
    if parent_id is Parent.ACTIVE_LEAF:
        parent_id = _active_leaf(s, session)
    elif parent_id is not None:
        parent = s.get(Message, parent_id)
        if parent is None or parent.session_id != session_id:
            raise ValueError(f"message {parent_id} is not a message of session {session_id[:64]!r}")
    if quota is not None:
        check_room(s, quota, session.owner, new_messages=2, new_bytes=text_bytes(values.get("content")))
    last = s.scalar(select(func.max(Message.position)).where(Message.session_id == session_id))
    now = utcnow()
    row = Message(
        session_id=session_id, parent_id=parent_id, position=0 if last is None else last + 1, **values
    )
    row.created_at = row.updated_at = now
    session.updated_at = now
    s.add(row)
    s.flush()
    session.active_leaf_id = row.id
    note(s, session.owner, messages=1, nbytes=text_bytes(values.get("content")))
    return message_record(row)


def check_reply_room(s: Session, session_id: str, quota: StorageQuota) -> None:
    """QuotaExceeded when the session's owner has no room for one more message: a new version of a reply, which no
    new user message made room for; LookupError when the session does not exist."""
    session = s.get(ChatSession, session_id)
    if session is None:
        raise LookupError(f"session {session_id!r} does not exist")
    check_room(s, quota, session.owner, new_messages=1)


def resume_assistant(s: Session, message_id: int, values: dict[str, Any]) -> MessageRecord:
    """Put a finished answer back in 'streaming' to extend it (continue), with `values`; it becomes the active
    leaf. LookupError when it was deleted."""
    row = s.get(Message, message_id)
    if row is None:
        raise LookupError(f"message {message_id} does not exist")
    if row.role != "assistant":
        raise RuntimeError(f"resume_assistant on message {message_id}, which is a {row.role} message")
    now = utcnow()
    for key, value in {**values, "status": MessageStatus.STREAMING.value}.items():
        setattr(row, key, value)
    row.updated_at = row.session.updated_at = now
    row.session.active_leaf_id = row.id
    s.flush()
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
    """Delete the message and the branches below it; 0 when it is not in that session. An active leaf among them
    moves to the newest message left below the deleted one's parent."""
    first = s.get(Message, message_id)
    if first is None or first.session_id != session_id:
        return 0
    session = s.get_one(ChatSession, session_id)
    tree = get_tree(s, session.owner, session_id)
    assert tree is not None, f"session {session_id!r} vanished inside its transaction"
    doomed = {message_id}
    for m in tree.messages:  # creation order: a parent comes before its children
        if m.parent_id in doomed:
            doomed.add(m.id)
    s.execute(delete(Message).where(Message.id.in_(doomed)))
    if tree.leaf_id in doomed:
        rest = MessageTree(tuple(m for m in tree.messages if m.id not in doomed), None)
        parent = first.parent_id
        session.active_leaf_id = rest.newest_under(parent) if parent is not None else rest.leaf_id
    session.updated_at = utcnow()
    forget(s, session.owner)
    return len(doomed)

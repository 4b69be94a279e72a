"""Chats in the database: sessions and their messages as a tree, one synchronous function of an ORM session per
operation, each checking its own arguments (ValueError) and the storage quota of the database it runs on.
`ChatStore` binds them as async methods run on the database's threads (app/db/threads.py)."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.db import search
from app.db.models import FINAL_ASSISTANT_STATUSES, ROLES, ChatSession, Message, MessageStatus, utcnow
from app.db.presets import PresetRef, session_preset_id
from app.db.prompt_history import list_prompt_changes, record_change
from app.db.quota import check_room, quota_of
from app.db.records import (
    MessageRecord,
    SessionRecord,
    check_owner,
    check_settings,
    check_text,
    message_record,
    prompt_changes,
    session_record,
    storable,
)
from app.db.threads import FeatureStore, reads, writes
from app.db.tree import MessageTree, Parent
from app.db.usage import forget, nbytes, note, text_bytes, tracking

logger = logging.getLogger(__name__)
MAX_TITLE_CHARS = 200


def _owned(s: Session, owner: str, session_id: str) -> ChatSession | None:
    row = s.get(ChatSession, session_id)
    return row if row is not None and row.owner == owner else None


def mark_streaming_interrupted(s: Session) -> int:
    """At start: mark assistant rows still 'streaming' (left by a process that died) as 'interrupted'; returns how
    many."""
    query = (
        update(Message)
        .where(Message.status == MessageStatus.STREAMING.value)
        .values(status=MessageStatus.INTERRUPTED.value, updated_at=utcnow())
    )
    num_interrupted = s.execute(query).rowcount
    if num_interrupted:
        logger.warning("marked %d answers left streaming by a previous run as interrupted", num_interrupted)
    return num_interrupted


def create_session(
    s: Session,
    owner: str,
    *,
    title: str = "New chat",
    system_prompt: str = "",
    settings: dict[str, Any] | None = None,
    preset_id: str | None | PresetRef = None,
) -> SessionRecord:
    """Create an empty session for `owner` (QuotaExceeded when the owner or the database has no room for it),
    following `preset_id` (one of the owner's presets; OWNER_DEFAULT: its default preset, if any; ValueError for
    another owner's)."""
    check_owner(owner)
    _check_title(title)
    check_text("system_prompt", system_prompt)
    check_settings(settings)
    preset_id = session_preset_id(s, owner, preset_id)
    check_room(s, quota_of(s), owner, new_sessions=1, new_bytes=text_bytes(title, system_prompt))
    now = utcnow()
    row = ChatSession(
        owner=owner,
        title=title,
        system_prompt=system_prompt,
        settings=dict(settings or {}),
        preset_id=preset_id,
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
    """The session, or None when it does not exist or belongs to someone else."""
    row = _owned(s, owner, session_id)
    return None if row is None else session_record(row)


def update_session(
    s: Session,
    owner: str,
    session_id: str,
    *,
    title: str | None = None,
    system_prompt: str | None = None,
    settings: dict[str, Any] | None = None,
    preset_id: str | None | PresetRef = PresetRef.KEEP,
) -> SessionRecord | None:
    """Change the fields given (settings are replaced whole; preset_id None: no preset); None when the session
    is missing; QuotaExceeded when longer text would not fit; ValueError when `preset_id` is not one of the
    owner's presets."""
    changes: dict[str, Any] = {}
    if preset_id is not PresetRef.KEEP:
        changes["preset_id"] = preset_id
    if title is not None:
        _check_title(title)
        changes["title"] = title
    changes.update(prompt_changes(system_prompt, settings))
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
    if (
        "system_prompt" in changes
    ):  # a change after turns is kept, for the export to show where it took effect
        grown += record_change(s, row, changes["system_prompt"])
    check_room(s, quota_of(s), owner, new_bytes=grown)
    for key, value in changes.items():
        setattr(row, key, value)
    row.updated_at = utcnow()
    s.flush()
    note(s, owner, nbytes=grown)
    return session_record(row)


def delete_session(s: Session, owner: str, session_id: str) -> bool:
    """Delete the owner's session and (by cascade) its messages; False when it is missing."""
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
    role: str,
    content: str,
    *,
    token_ids: list[int] | None = None,
    status: MessageStatus = MessageStatus.COMPLETE,
    parent_id: int | None | Parent = Parent.ACTIVE_LEAF,
) -> MessageRecord:
    """Add a message after `parent_id` (default: the active leaf; None: a first message, beside any other)
    and make it the active leaf; LookupError when the session does not exist, ValueError when the parent is not
    one of its messages.

    A user message must fit the quota together with its reply (QuotaExceeded otherwise).
    """
    values = _message_values(role, content, token_ids, status)
    return _insert_message(s, session_id, values, role == "user", parent_id)


def start_assistant(
    s: Session,
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
    return _insert_message(s, session_id, values, False, parent_id)


def _insert_message(
    s: Session, session_id: str, values: dict[str, Any], room_for_reply: bool, parent_id: int | None | Parent
) -> MessageRecord:
    """Insert a message row after `parent_id`, as the active leaf. `room_for_reply`: the owner must have room for
    it and the reply it asks for."""
    session = s.get(ChatSession, session_id)
    if session is None:
        raise LookupError(f"session {session_id!r} does not exist")
    if parent_id is Parent.ACTIVE_LEAF:
        parent_id = _active_leaf(s, session)
    elif parent_id is not None:
        parent = s.get(Message, parent_id)
        if parent is None or parent.session_id != session_id:
            raise ValueError(f"message {parent_id} is not a message of session {session_id[:64]!r}")
    if room_for_reply:
        check_room(s, quota_of(s), session.owner, new_messages=2, new_bytes=text_bytes(values.get("content")))
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


def check_reply_room(s: Session, session_id: str) -> None:
    """Before a new version of a reply (regenerate): QuotaExceeded when the session's owner has no room for one more
    message (a new user message makes room for its reply; a regenerate adds a reply and keeps the old one);
    LookupError when the session does not exist."""
    quota = quota_of(s)
    if not (quota.max_messages or quota.max_database_bytes):  # the limits a message counts against
        return
    session = s.get(ChatSession, session_id)
    if session is None:
        raise LookupError(f"session {session_id!r} does not exist")
    check_room(s, quota, session.owner, new_messages=1)


def resume_assistant(
    s: Session,
    message_id: int,
    *,
    prompt_tokens: int,
    cached_tokens: int,
    truncated_turns: int,
    tokenizer_fingerprint: str,
) -> MessageRecord:
    """Continue an answer: back to 'streaming' with the new request's prompt figures, its text kept (flushes
    and the final write then carry the whole text); it becomes the active leaf. LookupError when it was deleted."""
    values = dict(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        truncated_turns=truncated_turns,
        tokenizer_fingerprint=tokenizer_fingerprint,
    )
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
    content = storable(content)
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


def finish_assistant(
    s: Session,
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
    """Record the final answer; no-op when its session was deleted meanwhile."""
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


class ChatStore(FeatureStore):
    """Chat sessions and their messages, owner-scoped: another owner's session is treated as missing (None /
    False). Writes a client asks for (a session, a rename, a user message, room for a regenerated reply) are
    checked against the database's quota and raise QuotaExceeded past it; replies are not (they must be stored:
    their room was checked before they started)."""

    create_session = writes(create_session)
    list_sessions = reads(list_sessions)
    get_session = reads(get_session)
    update_session = writes(update_session)
    delete_session = writes(delete_session)
    list_messages = reads(list_messages)
    get_tree = reads(get_tree)
    prompt_changes = reads(list_prompt_changes)
    switch_branch = writes(switch_branch)
    search_messages = reads(search.search_messages)
    add_message = writes(add_message)
    check_reply_room = writes(check_reply_room)
    start_assistant = writes(start_assistant)
    resume_assistant = writes(resume_assistant)
    flush_assistant = writes(flush_assistant)
    finish_assistant = writes(finish_assistant)
    delete_messages_from = writes(delete_messages_from)

"""Files attached to chats, in the database: an upload waits unsent (message_id None) until a user message carries it.

An attachment's text and name count against its owner's bytes like message text (app/db/quota.py), from the upload
on; it goes with its session or its message (ON DELETE CASCADE).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.models import Attachment, ChatSession, utcnow
from app.db.quota import check_room, quota_of
from app.db.records import AttachmentRecord, attachment_record, check_text
from app.db.usage import note, text_bytes

MAX_FILENAME_CHARS = 255
MAX_MEDIA_TYPE_CHARS = 100


def _owned_session(s: Session, owner: str, session_id: str) -> ChatSession | None:
    row = s.get(ChatSession, session_id)
    return row if row is not None and row.owner == owner else None


def add_attachment(
    s: Session,
    owner: str,
    session_id: str,
    *,
    filename: str,
    media_type: str,
    num_bytes: int,
    text: str,
    num_tokens: int,
    max_unsent: int = 0,
) -> AttachmentRecord | None:
    """Store an unsent attachment in the owner's session (None: no such session of the owner); QuotaExceeded past
    the owner's bytes; ValueError past `max_unsent` files waiting in the session (0: no limit) or for a bad field."""
    if not isinstance(filename, str) or not 0 < len(filename) <= MAX_FILENAME_CHARS:
        raise ValueError(f"filename must be 1 to {MAX_FILENAME_CHARS} characters, got {filename!r:.40}")
    if not isinstance(media_type, str) or not 0 < len(media_type) <= MAX_MEDIA_TYPE_CHARS:
        raise ValueError(f"media_type must be 1 to {MAX_MEDIA_TYPE_CHARS} characters, got {media_type!r:.40}")
    check_text("filename", filename)
    check_text("text", text)
    session = _owned_session(s, owner, session_id)
    if session is None:
        return None
    if max_unsent:
        waiting = s.scalar(
            select(func.count(Attachment.id)).where(
                Attachment.session_id == session_id, Attachment.message_id.is_(None)
            )
        )
        if waiting is not None and waiting >= max_unsent:
            raise ValueError(
                f"{waiting} files are already attached to the next message, its limit "
                f"(max_attachments_per_message {max_unsent}): send or remove one first"
            )
    added = text_bytes(filename, text)
    check_room(s, quota_of(s), owner, new_bytes=added)
    row = Attachment(
        session_id=session_id,
        message_id=None,
        filename=filename,
        media_type=media_type,
        num_bytes=num_bytes,
        text=text,
        num_tokens=num_tokens,
        created_at=utcnow(),
    )
    s.add(row)
    s.flush()
    note(s, owner, nbytes=added)
    return attachment_record(row)


def get_attachment(s: Session, owner: str, session_id: str, attachment_id: int) -> AttachmentRecord | None:
    """One attachment of the owner's session, or None (missing, or someone else's)."""
    row = s.get(Attachment, attachment_id)
    if row is None or row.session_id != session_id or _owned_session(s, owner, session_id) is None:
        return None
    return attachment_record(row)


def unsent_attachments(
    s: Session, owner: str, session_id: str, attachment_ids: Sequence[int]
) -> list[AttachmentRecord] | None:
    """The attachments a new message will carry, in the order named (None: no such session of the owner);
    ValueError naming an id that is not an unsent attachment of the session."""
    if _owned_session(s, owner, session_id) is None:
        return None
    if not attachment_ids:
        return []
    rows = {r.id: r for r in s.scalars(select(Attachment).where(Attachment.id.in_(list(attachment_ids))))}
    records = []
    for attachment_id in attachment_ids:
        row = rows.get(attachment_id)
        if row is None or row.session_id != session_id:
            raise ValueError(f"attachment {attachment_id} is not an attachment of this session")
        if row.message_id is not None:
            raise ValueError(f"attachment {attachment_id} was already sent with message {row.message_id}")
        records.append(attachment_record(row))
    return records


def delete_attachment(s: Session, owner: str, session_id: str, attachment_id: int) -> bool:
    """Remove an unsent attachment of the owner's session; False when there is none; ValueError when it was sent
    (it is part of its message's prompt: it goes with the message)."""
    row = s.get(Attachment, attachment_id)
    if row is None or row.session_id != session_id or _owned_session(s, owner, session_id) is None:
        return False
    if row.message_id is not None:
        raise ValueError(
            f"attachment {attachment_id} was sent with message {row.message_id}: it is part of that message's "
            "prompt and goes only with the message"
        )
    s.execute(delete(Attachment).where(Attachment.id == attachment_id))
    note(s, owner, nbytes=-text_bytes(row.filename, row.text))
    return True


def attach_to_message(
    s: Session,
    owner: str,
    session_id: str,
    message_id: int,
    attachment_ids: Sequence[int],
    copied_from: int | None,
) -> tuple[AttachmentRecord, ...]:
    """Give a new user message its attachments: the unsent ones named (they move to it, in the order of their ids),
    then, for an edit, copies of the edited message's (`copied_from`; their bytes count again), the order that
    `attachments_by_message` reads back. ValueError when a named one is not unsent."""
    linked = sorted(unsent_attachments(s, owner, session_id, attachment_ids) or [], key=lambda a: a.id)
    rows = [s.get_one(Attachment, a.id) for a in linked]
    for row in rows:
        row.message_id = message_id
    if copied_from is not None:
        old = s.scalars(
            select(Attachment).where(Attachment.message_id == copied_from).order_by(Attachment.id)
        )
        copies = [
            Attachment(
                session_id=session_id,
                message_id=message_id,
                filename=a.filename,
                media_type=a.media_type,
                num_bytes=a.num_bytes,
                text=a.text,
                num_tokens=a.num_tokens,
                created_at=utcnow(),
            )
            for a in old
        ]
        added = sum(text_bytes(a.filename, a.text) for a in copies)
        check_room(s, quota_of(s), owner, new_bytes=added)
        s.add_all(copies)
        note(s, owner, nbytes=added)
        rows += copies
    s.flush()
    return tuple(attachment_record(row) for row in rows)


def attachments_by_message(s: Session, session_id: str) -> dict[int, tuple[AttachmentRecord, ...]]:
    """The session's sent attachments, grouped by message, each group in the order attached."""
    query = (
        select(Attachment)
        .where(Attachment.session_id == session_id, Attachment.message_id.is_not(None))
        .order_by(Attachment.id)
    )
    grouped: dict[int, list[AttachmentRecord]] = {}
    for row in s.scalars(query):
        assert row.message_id is not None
        grouped.setdefault(row.message_id, []).append(attachment_record(row))
    return {message_id: tuple(records) for message_id, records in grouped.items()}


def list_unsent(s: Session, owner: str, session_id: str) -> list[AttachmentRecord] | None:
    """The files waiting for the session's next message (None: no such session of the owner)."""
    if _owned_session(s, owner, session_id) is None:
        return None
    query = (
        select(Attachment)
        .where(Attachment.session_id == session_id, Attachment.message_id.is_(None))
        .order_by(Attachment.id)
    )
    return [attachment_record(row) for row in s.scalars(query)]

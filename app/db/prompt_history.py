"""A chat's system prompt over time: a change made after some of its turns is recorded (`SystemPromptChange`: the
prompt it replaced, and when), so an export shows each prompt where it took effect instead of the last one at the
top. Changes with no turn between them are one change (its first replaced prompt stays; changed back, it is gone),
so a chat holds at most one change per turn. Their text counts against the owner's quota like a system prompt's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.db.models import ChatSession, Message, SystemPromptChange
from app.db.records import as_utc
from app.db.usage import text_bytes


@dataclass(frozen=True)
class PromptChange:
    """The system prompt `previous` was in effect until `changed_at`, `system_prompt` from then on."""

    changed_at: datetime
    previous: str
    system_prompt: str


def record_change(s: Session, row: ChatSession, new_prompt: str) -> int:
    """Record that `row`'s system prompt becomes `new_prompt` (call it before changing the row); the bytes of text
    this adds to the owner's (negative: frees)."""
    if new_prompt == row.system_prompt:
        return 0
    newest_turn = s.scalar(select(func.max(Message.created_at)).where(Message.session_id == row.id))
    if newest_turn is None:  # no turn saw the old prompt: nothing to tell
        return 0
    last = s.scalars(
        select(SystemPromptChange)
        .where(SystemPromptChange.session_id == row.id)
        .order_by(SystemPromptChange.id.desc())
        .limit(1)
    ).first()
    if last is not None and as_utc(last.created_at) >= as_utc(newest_turn):  # no turn since: the same change
        if last.previous != new_prompt:
            return 0
        s.delete(last)  # changed back before any turn saw the new one
        return -text_bytes(last.previous)
    s.add(SystemPromptChange(session_id=row.id, previous=row.system_prompt))
    return text_bytes(row.system_prompt)


def list_prompt_changes(s: Session, owner: str, session_id: str) -> list[PromptChange] | None:
    """The owner's session's system prompt changes, oldest first; None when the session is missing."""
    row = s.get(ChatSession, session_id)
    if row is None or row.owner != owner:
        return None
    found = s.scalars(
        select(SystemPromptChange)
        .where(SystemPromptChange.session_id == session_id)
        .order_by(SystemPromptChange.id)
    ).all()
    if not found:
        return []
    following = [change.previous for change in found[1:]] + [row.system_prompt]
    return [
        PromptChange(as_utc(change.created_at), change.previous, new)
        for change, new in zip(found, following, strict=True)
    ]

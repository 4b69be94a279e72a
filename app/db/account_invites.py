"""The synchronous database work behind invites: made by an admin, listed and revoked by admins, used once.

An invite lives while it is unused, unexpired, and its creator is still an enabled admin: the role it grants is
the creator's to give only while the creator holds it. `accept_invite` checks that in the transaction that creates
the account, with the creator's row locked (PostgreSQL: FOR UPDATE; SQLite has one writer), so a demotion, a
disable or a deletion committed first wins; those also delete the creator's pending invites
(app/db/accounts.py `_drop_pending_invites`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.db.account_models import Invite, User
from app.db.accounts import UserRecord, check_new_account, create_user
from app.db.models import expires_in, utcnow
from app.db.records import as_utc


@dataclass(frozen=True)
class InviteRecord:
    """An invite as stored (never its token): `id` is the token's SHA-256, `created_by` the creator's username."""

    id: str
    username: str
    role: str
    created_by: str | None
    created_at: datetime
    expires_at: datetime


def _record(row: Invite, creator: User | None) -> InviteRecord:
    return InviteRecord(
        row.id,
        row.username,
        row.role,
        creator.username if creator is not None else None,
        as_utc(row.created_at),
        as_utc(row.expires_at),
    )


def _creator_may_grant(creator: User | None) -> bool:
    return creator is not None and not creator.disabled and creator.role == "admin"


def _live_invite(s: Session, token_hash: str, *, lock: bool = False) -> tuple[Invite, User] | None:
    """The invite and its creator while the invite is unused, unexpired and its creator an enabled admin; `lock`:
    the creator's row is locked first and the invite read again after (a concurrent demotion or acceptance that
    committed meanwhile is seen)."""
    row = s.get(Invite, token_hash)
    if row is None or row.created_by is None:  # no creator: deleted (ON DELETE SET NULL)
        return None
    creator = s.get(User, row.created_by, with_for_update=True if lock else None, populate_existing=lock)
    if lock:
        row = s.execute(
            select(Invite).where(Invite.id == token_hash).execution_options(populate_existing=True)
        ).scalar_one_or_none()
    if row is None or row.used_at is not None or as_utc(row.expires_at) <= utcnow():
        return None
    return (row, creator) if _creator_may_grant(creator) else None  # type: ignore[return-value]


def create_invite(
    s: Session, token_hash: str, username: str, role: str, created_by: str, lifetime_s: float
) -> InviteRecord:
    """Record an invite for a new account, valid for `lifetime_s`; AccountConflict when the username is taken."""
    check_new_account(s, username, role)
    row = Invite(
        id=token_hash,
        username=username,
        role=role,
        created_by=created_by,
        created_at=utcnow(),
        expires_at=expires_in(lifetime_s),
    )
    s.add(row)
    s.flush()
    return _record(row, s.get(User, created_by))


def get_invite(s: Session, token_hash: str) -> InviteRecord | None:
    """The invite while it lives (see the module doc); else None."""
    found = _live_invite(s, token_hash)
    return None if found is None else _record(*found)


def accept_invite(s: Session, token_hash: str, password_hash: str) -> UserRecord | None:
    """Use the invite: create its account with this password. None when it is unknown, used, expired, revoked or
    its creator may no longer grant it; AccountConflict when its username was taken meanwhile."""
    found = _live_invite(s, token_hash, lock=True)
    if found is None:
        return None
    row, _ = found
    row.used_at = utcnow()
    return create_user(s, row.username, password_hash, row.role)


def list_invites(s: Session) -> list[InviteRecord]:
    """The pending invites (unused, unexpired, of a creator who may still grant them), soonest to expire first."""
    query = (
        select(Invite, User)
        .join(User, User.id == Invite.created_by)
        .where(Invite.used_at.is_(None), Invite.expires_at > utcnow())
        .order_by(Invite.expires_at)
    )
    return [_record(row, creator) for row, creator in s.execute(query) if _creator_may_grant(creator)]


def revoke_invite(s: Session, invite_id: str) -> bool:
    """Delete an unused invite; False when there is none of that id."""
    return s.execute(delete(Invite).where(Invite.id == invite_id, Invite.used_at.is_(None))).rowcount > 0

"""Admin sign-ins in the database (the cookie holds a secret, the row its SHA-256, `session_hash`): one synchronous
function per operation, bound as `AdminStore`'s async methods (app/db/threads.py)."""

from __future__ import annotations

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from app.db.models import AdminSession, expires_in, utcnow
from app.db.records import as_utc
from app.db.threads import FeatureStore, reads, writes


def create(
    s: Session, session_hash: str, token_fingerprint: str, client: str | None, lifetime_s: float
) -> None:
    """Record a sign-in, valid for `lifetime_s` unless revoked."""
    s.add(
        AdminSession(
            id=session_hash,
            token_fingerprint=token_fingerprint,
            client=(client or "")[:64],
            created_at=utcnow(),
            expires_at=expires_in(lifetime_s),
        )
    )


def is_valid(s: Session, session_hash: str, token_fingerprint: str) -> bool:
    """Whether the sign-in exists, is neither revoked nor expired, and was made with this admin token."""
    row = s.get(AdminSession, session_hash)
    return (
        row is not None
        and row.revoked_at is None
        and as_utc(row.expires_at) > utcnow()
        and row.token_fingerprint == token_fingerprint
    )


def revoke(s: Session, session_hash: str) -> bool:
    """Revoke one sign-in; False when it was missing or revoked already."""
    query = (
        update(AdminSession)
        .where(AdminSession.id == session_hash, AdminSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return s.execute(query).rowcount > 0


def revoke_all_except(s: Session, token_fingerprint: str | None) -> int:
    """Drop expired sign-ins; revoke the live ones made with another admin token (all when None)."""
    now = utcnow()
    s.execute(delete(AdminSession).where(AdminSession.expires_at <= now))
    query = update(AdminSession).where(AdminSession.revoked_at.is_(None))
    if token_fingerprint is not None:
        query = query.where(AdminSession.token_fingerprint != token_fingerprint)
    return s.execute(query.values(revoked_at=now)).rowcount


class AdminStore(FeatureStore):
    """The admin token's sign-ins: made, checked, revoked; the ones made with an older token end at start."""

    create_admin_session = writes(create)
    admin_session_valid = reads(is_valid)
    revoke_admin_session = writes(revoke)
    revoke_admin_sessions_except = writes(revoke_all_except)

"""The synchronous database work behind the store's admin sign-ins: one function per operation."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from app.db.models import AdminSession, utcnow
from app.db.records import as_utc


def create(s: Session, session_hash: str, token_fingerprint: str, client: str, expires_at: datetime) -> None:
    """Insert a sign-in."""
    s.add(
        AdminSession(
            id=session_hash,
            token_fingerprint=token_fingerprint,
            client=client,
            created_at=utcnow(),
            expires_at=expires_at,
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

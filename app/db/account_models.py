"""SQLAlchemy models of accounts (`--auth local|oidc`): users, their sign-ins, invites and API keys.

A sign-in's and an invite's id, and an API key's `secret_hash`, are the SHA-256 of a random secret that only the
browser (cookie), the invite link or the key's holder has, so the tables alone sign no one in. A user's id is random and never reused: the owner id and prefix-cache
salt derived from it (`user:<id>`) never pass to a later account.
"""

from __future__ import annotations

import secrets
from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, DateTime, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, utcnow

ACCOUNT_ROLES = ("admin", "user")
_ROLE_CHECK = f"role IN ({', '.join(repr(r) for r in ACCOUNT_ROLES)})"


def new_user_id() -> str:
    """A random user id (96 bits, URL-safe)."""
    return secrets.token_urlsafe(12)


class User(Base):
    """An account: a password (argon2id hash) and/or an OpenID Connect identity (issuer, subject)."""

    __tablename__ = "users"
    __table_args__ = (
        UniqueConstraint("oidc_issuer", "oidc_subject"),
        CheckConstraint(_ROLE_CHECK, name="role"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_user_id)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(255), nullable=True)  # None: OIDC sign-in only
    role: Mapped[str] = mapped_column(String(16))
    oidc_issuer: Mapped[str | None] = mapped_column(String(255), nullable=True)
    oidc_subject: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)


class UserSession(Base):
    """A signed-in browser: the cookie holds a random secret whose SHA-256 is the id. It ends when it expires, on
    sign-out, on a password change, and when the account is disabled or deleted."""

    __tablename__ = "user_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    client: Mapped[str] = mapped_column(String(64))  # the address that signed in
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Invite(Base):
    """A one-time invite: whoever holds the link's token sets the password of the account it names, once, before
    it expires."""

    __tablename__ = "invites"
    __table_args__ = (CheckConstraint(_ROLE_CHECK, name="role"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    username: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    # None once its creator is deleted: such an invite is dead (see app/db/accounts.py `_live_invite`)
    created_by: Mapped[str | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), nullable=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class ApiKey(Base):
    """An account's API key: `Authorization: Bearer pck_...` acts as the account. `prefix` (the key's first
    characters) tells the owner its keys apart; a revoked key's row stays so that its use is told apart from a
    guess."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_user_id)  # public, not a secret
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

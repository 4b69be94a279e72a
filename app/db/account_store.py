"""The store's account calls: async wrappers of app/db/accounts.py, run on the store's threads like every other
call (writes on the writer, lookups on a reader). Mixed into `Store`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from app.db import accounts
from app.db.accounts import InviteRecord, UserRecord
from app.db.models import utcnow

T = TypeVar("T")


class AccountStore:
    """Users, sign-ins and invites. Secrets never reach the database: sign-ins and invites are stored by the
    SHA-256 of their secret (`*_hash`), passwords as argon2id hashes made by the caller."""

    # provided by Store
    _tx: Callable[..., Any]
    _read: Callable[..., Any]

    async def create_user(self, username: str, password_hash: str | None, role: str) -> UserRecord:
        """A new account; AccountConflict when the username is taken."""
        return await self._tx(accounts.create_user, username, password_hash, role)

    async def ensure_admin(self, username: str, password_hash: str) -> bool:
        """Create this admin unless an account of that name exists; True when created."""
        return await self._tx(accounts.ensure_admin, username, password_hash)

    async def user_credentials(self, username: str) -> tuple[UserRecord, str | None] | None:
        """The account of this name and its password hash, or None."""
        return await self._read(accounts.credentials, username)

    async def get_user(self, user_id: str) -> UserRecord | None:
        """The account, or None."""
        return await self._read(accounts.get_user, user_id)

    async def list_users(self) -> list[UserRecord]:
        """Every account, by name."""
        return await self._read(accounts.list_users)

    async def set_password(self, user_id: str, password_hash: str, *, revoke: bool) -> bool:
        """Replace the password hash (`revoke`: and end every sign-in); False when the account is missing."""
        return await self._tx(accounts.set_password, user_id, password_hash, revoke)

    async def update_user(
        self, user_id: str, *, role: str | None = None, disabled: bool | None = None
    ) -> UserRecord | None:
        """Change the role, disable (ending every sign-in) or enable; None when missing."""
        return await self._tx(accounts.update_user, user_id, role, disabled)

    async def delete_user(self, user_id: str, owner: str) -> bool:
        """Delete the account, its sign-ins and the chats of its owner id; False when missing."""
        return await self._tx(accounts.delete_user, user_id, owner)

    async def create_user_session(
        self, session_hash: str, user_id: str, client: str | None, lifetime_s: float
    ) -> None:
        """Record a sign-in valid for `lifetime_s` unless revoked."""
        expires_at = utcnow() + timedelta(seconds=lifetime_s)
        await self._tx(accounts.create_session, session_hash, user_id, (client or "")[:64], expires_at)

    async def session_user(self, session_hash: str) -> UserRecord | None:
        """The enabled account of a live sign-in, or None."""
        return await self._read(accounts.session_user, session_hash)

    async def revoke_user_session(self, session_hash: str) -> bool:
        """End one sign-in; False when there was no live one."""
        return await self._tx(accounts.revoke_session, session_hash)

    async def drop_expired_accounts_rows(self) -> int:
        """Delete expired sign-ins and invites, and used invites."""
        return await self._tx(accounts.drop_expired)

    async def create_invite(
        self, token_hash: str, username: str, role: str, created_by: str | None, lifetime_s: float
    ) -> InviteRecord:
        """Record an invite valid for `lifetime_s`; AccountConflict when the username is taken."""
        expires_at = utcnow() + timedelta(seconds=lifetime_s)
        return await self._tx(accounts.create_invite, token_hash, username, role, created_by, expires_at)

    async def get_invite(self, token_hash: str) -> InviteRecord | None:
        """A live invite, or None."""
        return await self._read(accounts.get_invite, token_hash)

    async def accept_invite(self, token_hash: str, password_hash: str) -> UserRecord | None:
        """Use a live invite (None otherwise): its account is created with this password."""
        return await self._tx(accounts.accept_invite, token_hash, password_hash)

    async def oidc_user(self, issuer: str, subject: str, usernames: list[str]) -> UserRecord:
        """The account of an OpenID Connect identity, created on its first sign-in."""
        return await self._tx(accounts.oidc_user, issuer, subject, usernames)

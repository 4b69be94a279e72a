"""The store's account calls: async wrappers of app/db/accounts.py, run on the store's threads like every other
call (writes on the writer, lookups on a reader). Mixed into `Store`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from app.db import account_invites, account_keys, accounts
from app.db.account_invites import InviteRecord
from app.db.account_keys import ApiKeyRecord
from app.db.accounts import UserRecord
from app.db.models import utcnow

T = TypeVar("T")


class AccountStore:
    """Users, sign-ins, invites and API keys. Secrets never reach the database: sign-ins, invites and API keys are
    stored by the SHA-256 of their secret (`*_hash`), passwords as argon2id hashes made by the caller."""

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
        """Change the role, disable (ending every sign-in and API key) or enable; None when missing."""
        return await self._tx(accounts.update_user, user_id, role, disabled)

    async def delete_user(self, user_id: str, owner: str) -> bool:
        """Delete the account, its sign-ins, API keys and invites, and the chats of its owner id; False when
        missing."""
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
        self, token_hash: str, username: str, role: str, created_by: str, lifetime_s: float
    ) -> InviteRecord:
        """Record an invite valid for `lifetime_s`; AccountConflict when the username is taken."""
        expires_at = utcnow() + timedelta(seconds=lifetime_s)
        return await self._tx(
            account_invites.create_invite, token_hash, username, role, created_by, expires_at
        )

    async def get_invite(self, token_hash: str) -> InviteRecord | None:
        """A live invite, or None."""
        return await self._read(account_invites.get_invite, token_hash)

    async def accept_invite(self, token_hash: str, password_hash: str) -> UserRecord | None:
        """Use a live invite (None otherwise): its account is created with this password."""
        return await self._tx(account_invites.accept_invite, token_hash, password_hash)

    async def list_invites(self) -> list[InviteRecord]:
        """The pending invites, soonest to expire first."""
        return await self._read(account_invites.list_invites)

    async def revoke_invite(self, invite_id: str) -> bool:
        """Delete an unused invite; False when there is none of that id."""
        return await self._tx(account_invites.revoke_invite, invite_id)

    async def create_api_key(
        self, user_id: str, name: str, prefix: str, secret_hash: str, max_keys: int
    ) -> ApiKeyRecord:
        """Record an API key; AccountConflict past `max_keys` live keys or for a disabled account."""
        return await self._tx(account_keys.create_key, user_id, name, prefix, secret_hash, max_keys)

    async def list_api_keys(self, user_id: str) -> list[ApiKeyRecord]:
        """The account's live API keys, oldest first."""
        return await self._read(account_keys.list_keys, user_id)

    async def revoke_api_key(self, user_id: str, key_id: str) -> bool:
        """Revoke one of the account's live keys; False when it has none of that id."""
        return await self._tx(account_keys.revoke_key, user_id, key_id)

    async def api_key_user(self, secret_hash: str) -> tuple[ApiKeyRecord, UserRecord] | None:
        """The key of this secret's hash (revoked ones too) and its account, or None."""
        return await self._read(account_keys.key_user, secret_hash)

    async def api_key_live(self, key_id: str) -> bool:
        """Whether the key exists, is not revoked, and its account is enabled (for re-checking long streams)."""
        return await self._read(account_keys.key_live, key_id)

    async def oidc_user(self, issuer: str, subject: str, usernames: list[str]) -> UserRecord:
        """The account of an OpenID Connect identity, created on its first sign-in."""
        return await self._tx(accounts.oidc_user, issuer, subject, usernames)

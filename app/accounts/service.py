"""Accounts (`--auth local|oidc`): sign-in and sign-out, passwords, invites, and what an account's deletion takes
with it (its API keys: app/accounts/api_keys.py, `keys`). The signed-in account is the identity everywhere: its owner id `user:<id>` owns its chats, and is the
prefix-cache salt, the quota owner and the rate-limit client of its requests.

HTTP lives in app/accounts/routes.py; this module sees plain values and the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.accounts.api_keys import ApiKeyService
from app.accounts.passwords import Passwords, check_password
from app.db import AccountConflict, InviteRecord, MessageStatus, Store, UserRecord
from app.engine_client.protocol import EngineClient, EngineUnavailable
from app.http.errors import APIError
from app.http.identity import Account, account_owner, normalize_username
from app.http.services import Services
from app.settings import Settings
from engine.core.outputs import CachePurge

logger = logging.getLogger(__name__)
WRONG_CREDENTIALS = "wrong username or password"
PURGE_WAIT_S = 5.0  # how long a deletion waits for the disk tier's queued writes before purging again


def secret_hash(secret: str) -> str:
    """What the database keeps of a sign-in's or an invite's secret: its SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


class ReplyStopper(Protocol):
    """What an account's deletion needs of the chat (app/chat/service.py's ChatService): stop a session's reply."""

    def stop(self, session_id: str, status: MessageStatus = ..., reason: str | None = None) -> bool: ...


@dataclass(frozen=True)
class SignIn:
    """A new sign-in: its account and the secret its cookie carries."""

    user: UserRecord
    secret: str


def conflict(exc: AccountConflict) -> APIError:
    """An account rule the write would break, as a 409."""
    return APIError(409, str(exc), code="account_conflict")


class AccountService:
    """Accounts over the store; `chat` and the loaded models' engines (`engines()`) are told when an account goes (its
    replies stop, its cached blocks are forgotten), `keys` when it is disabled or goes (what its API keys run ends)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        passwords: Passwords,
        chat: ReplyStopper,
        engines: Callable[[], list[EngineClient]],
        purge_unloaded: Callable[[str], int] = lambda cache_salt: 0,
    ) -> None:
        self.store = store
        self.settings = settings
        self.passwords = passwords
        self.chat = chat
        self.engines = engines
        self.purge_unloaded = purge_unloaded  # the disk tiers of the models not loaded now
        self.keys = ApiKeyService(store)

    @property
    def session_lifetime_s(self) -> float:
        return self.settings.account_session_days * 86400

    async def bootstrap(self) -> None:
        """At start: the first admin from the settings (`first_admin`), unless that name exists; old rows go."""
        await self.store.accounts.drop_expired_accounts_rows()
        if not self.settings.first_admin:
            return
        username = normalize_username(self.settings.first_admin)
        password_hash = await self.passwords.hash(check_password(self.settings.first_admin_password))
        if await self.store.accounts.ensure_admin(username, password_hash):
            logger.warning("created the first admin account %r (first_admin)", username)

    async def current(self, secret: str) -> Account | None:
        """The account a session cookie's secret signs in, or None (unknown, expired, revoked, disabled)."""
        session_hash = secret_hash(secret)
        user = await self.store.accounts.session_user(session_hash)
        return None if user is None else Account(user, session_hash)

    async def sign_in(
        self, username: object, password: object, client: str, *, known_device: bool = False
    ) -> SignIn:
        """Check a username and password and record a sign-in; 401 when they do not match (the same answer for
        an unknown name), 403 for a disabled account. `known_device`: the caller signed in to this name before
        (its check is not refused by a full hashing queue: `Passwords.verify`)."""
        if not isinstance(password, str) or not isinstance(username, str):
            raise APIError(400, "send the username and the password as strings", code="invalid_request")
        try:
            name = normalize_username(username)
        except ValueError:
            name = None
        found = await self.store.accounts.user_credentials(name) if name else None
        user, stored = found if found is not None else (None, None)
        known = name if known_device else None
        if (
            not await self.passwords.verify(stored, password[: 4 * 1024], known_device_of=known)
            or user is None
            or stored is None
        ):
            raise APIError(401, WRONG_CREDENTIALS, code="invalid_credentials")
        if user.disabled:
            raise APIError(403, "this account is disabled: ask an admin", code="account_disabled")
        if self.passwords.needs_rehash(stored):  # made with older parameters: store today's
            await self.store.accounts.set_password(user.id, await self.passwords.hash(password), revoke=False)
            logger.info("rehashed the password of %r with the current argon2 parameters", user.username)
        return await self.start_session(user, client)

    async def start_session(self, user: UserRecord, client: str) -> SignIn:
        """Record a sign-in of `user` (already authenticated)."""
        if user.disabled:
            raise APIError(403, "this account is disabled: ask an admin", code="account_disabled")
        secret = secrets.token_urlsafe(32)
        await self.store.accounts.create_user_session(
            secret_hash(secret), user.id, client, self.session_lifetime_s
        )
        return SignIn(user, secret)

    async def sign_out(self, account: Account) -> bool:
        """End this sign-in on the server (a copy of its cookie is worthless from now on)."""
        return await self.store.accounts.revoke_user_session(account.session_hash)

    async def change_password(
        self, account: Account, current: object, new: object, client: str, *, known_device: bool = False
    ) -> SignIn:
        """Check the current password, store the new one and end every sign-in and API key of the account; the
        caller gets a fresh sign-in. 403 when the current password is wrong."""
        if not isinstance(current, str):
            raise APIError(400, "send current_password as a string", code="invalid_request")
        new_password = _checked(new)
        found = await self.store.accounts.user_credentials(account.user.username)
        stored = found[1] if found is not None else None
        known = account.user.username if known_device else None
        if not await self.passwords.verify(stored, current, known_device_of=known):
            raise APIError(403, "the current password is wrong", code="invalid_credentials")
        await self.store.accounts.set_password(
            account.user.id, await self.passwords.hash(new_password), revoke=True
        )
        # its keys were revoked with its sign-ins: what they still run ends now
        self.keys.work.end_user(account.user.id)
        return await self.start_session(account.user, client)

    async def create_user(self, username: object, password: object, role: object) -> UserRecord:
        """An admin creates an account with a password."""
        name, role_ = _name_and_role(username, role)
        password_hash = await self.passwords.hash(_checked(password))
        try:
            return await self.store.accounts.create_user(name, password_hash, role_)
        except AccountConflict as exc:
            raise conflict(exc) from None

    async def invite(self, admin: Account, username: object, role: object) -> tuple[str, InviteRecord]:
        """An admin invites a new account: the one-time token of its link, and the invite."""
        name, role_ = _name_and_role(username, role)
        token = secrets.token_urlsafe(32)
        lifetime_s = self.settings.invite_hours * 3600
        try:
            record = await self.store.accounts.create_invite(
                secret_hash(token), name, role_, admin.user.id, lifetime_s
            )
        except AccountConflict as exc:
            raise conflict(exc) from None
        return token, record

    async def invite_for(self, token: object) -> InviteRecord:
        """The live invite of a token; 404 when it is unknown, used, expired, revoked, or its creator is no longer
        an enabled admin."""
        record = (
            await self.store.accounts.get_invite(secret_hash(token))
            if isinstance(token, str) and token
            else None
        )
        if record is None:
            raise _invite_gone()
        return record

    async def accept_invite(self, token: object, password: object, client: str) -> SignIn:
        """The invitee sets a password: the account exists from now on and this browser is signed in."""
        await self.invite_for(token)
        password_hash = await self.passwords.hash(_checked(password))
        assert isinstance(token, str)
        try:
            user = await self.store.accounts.accept_invite(secret_hash(token), password_hash)
        except AccountConflict as exc:
            raise conflict(exc) from None
        if user is None:  # used or revoked meanwhile, or its creator demoted, disabled or deleted
            raise _invite_gone()
        return await self.start_session(user, client)

    async def revoke_invite(self, invite_id: str) -> None:
        """An admin revokes a pending invite; 404 when there is none of that id."""
        if not await self.store.accounts.revoke_invite(invite_id):
            raise APIError(404, f"no pending invite {invite_id[:64]!r}", code="not_found")

    async def update_user(self, user_id: str, role: object = None, disabled: object = None) -> UserRecord:
        """An admin changes a role, or disables (ending every sign-in and API key, and what its keys run) or
        enables an account. An account that stops being an enabled admin loses its pending invites."""
        if role is not None and role not in ("admin", "user"):
            raise APIError(400, f"role must be admin or user, got {str(role)[:40]!r}", param="role")
        if disabled is not None and not isinstance(disabled, bool):
            raise APIError(400, "disabled must be true or false", param="disabled")
        try:
            user = await self.store.accounts.update_user(user_id, role=role, disabled=disabled)  # type: ignore[arg-type]
        except AccountConflict as exc:
            raise conflict(exc) from None
        if user is None:
            raise APIError(404, f"account {user_id[:40]!r} not found", code="not_found")
        if user.disabled:
            self.keys.work.end_user(user_id)
        return user

    async def delete_user(self, user_id: str) -> CachePurge:
        """Delete an account with its sign-ins, chats (their running replies stop first) and presets, then forget
        its cached blocks (RAM pool and disk tier); returns how many went."""
        owner = account_owner(user_id)
        for session in await self.store.chats.list_sessions(owner):
            self.chat.stop(session.id, status=MessageStatus.INTERRUPTED)
        try:
            deleted = await self.store.accounts.delete_user(user_id, owner)
        except AccountConflict as exc:
            raise conflict(exc) from None
        if not deleted:
            raise APIError(404, f"account {user_id[:40]!r} not found", code="not_found")
        self.keys.work.end_user(user_id)  # its /v1 streams (its chat replies stopped above)
        purged = await self.forget_cached_blocks(owner)
        logger.warning(
            "deleted account %s with its chats; its cached blocks went: %d in the RAM pool, %d on the disk tier",
            user_id,
            purged.ram_blocks,
            purged.disk_blocks,
        )
        return purged

    async def forget_cached_blocks(self, owner: str) -> CachePurge:
        """Purge the owner's salt from the RAM pool and the disk tier (`LLMEngine.purge_cache_salt`), on the engine
        thread after the aborts queued before it (the blocks those aborts freed are cached by then); they may still
        wait in the tier's write queue, so once it is empty (within PURGE_WAIT_S) the purge runs again.

        (With engine replicas, every replica purges; one that is restarting comes back with an empty RAM pool and
        purges nothing from its disk tier: see docs/operators/replicas.md.)"""
        engines = self.engines()  # every loaded model's (app/http/model_registry.py)
        purges = await _purge(engines, owner)
        deadline = time.monotonic() + PURGE_WAIT_S
        while time.monotonic() < deadline:
            try:
                tiers = [stats.tier for engine in engines for _, stats in await engine.stats_each()]
            except EngineUnavailable:  # a model unloaded meanwhile: its tier is purged below
                break
            if all(tier is None or tier.write_queue_depth == 0 for tier in tiers):
                break
            await asyncio.sleep(0.02)
        purges += await _purge(engines, owner)
        # last: a model unloaded during the purge has its tier purged here
        files = await asyncio.to_thread(self.purge_unloaded, owner)
        return CachePurge(sum(p.ram_blocks for p in purges), sum(p.disk_blocks for p in purges) + files)

    async def oidc_account(self, issuer: str, subject: str, claims: dict[str, object]) -> UserRecord:
        """The account of a verified OpenID Connect identity, made on its first sign-in; its username is the
        provider's preferred_username or email where free, else one derived from the subject."""
        candidates = []
        for key in ("preferred_username", "email"):
            try:
                candidates.append(normalize_username(claims.get(key)))
            except ValueError:
                continue
        unique = "oidc-" + hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()[:16]
        try:
            return await self.store.accounts.oidc_user(issuer, subject, [*candidates, unique])
        except AccountConflict as exc:
            raise conflict(exc) from None


def _checked(password: object) -> str:
    try:
        return check_password(password)
    except ValueError as exc:
        raise APIError(400, str(exc), param="password") from None


def _name_and_role(username: object, role: object) -> tuple[str, str]:
    try:
        name = normalize_username(username)
    except ValueError as exc:
        raise APIError(400, str(exc), param="username") from None
    role = "user" if role is None else role
    if role not in ("admin", "user"):
        raise APIError(400, f"role must be admin or user, got {str(role)[:40]!r}", param="role")
    return name, str(role)


def _invite_gone() -> APIError:
    return APIError(
        404,
        "this invite link is not valid: it was used, revoked or mistyped, or it expired",
        code="invite_not_found",
    )


def accounts_of(svc: Services) -> AccountService:
    """The app's account service (accounts on: `--auth local|oidc`), typed for this feature."""
    accounts = svc.accounts
    assert isinstance(accounts, AccountService), (
        "the lifespan builds Services.accounts whenever accounts are on"
    )
    return accounts


async def _purge(engines: list[EngineClient], owner: str) -> list[CachePurge]:
    """Each engine's purge of `owner`'s blocks; an engine that stopped meanwhile (a model unloaded) is skipped."""
    purges: list[CachePurge] = []
    for engine in engines:
        try:
            purges += await engine.purge_cache_salt(owner)
        except EngineUnavailable:
            continue
    return purges

"""Accounts in the store and the account service: users, sign-ins that end (sign-out, password change, disable,
expiry), invites used once, OIDC identities, the last admin kept, and argon2id hashes verified and rehashed."""

from __future__ import annotations

import pytest
from argon2 import PasswordHasher

from app.accounts.passwords import Passwords, check_password
from app.accounts.service import AccountService, secret_hash
from app.db import AccountConflict, Store
from app.http.errors import APIError
from app.http.identity import account_owner, normalize_username
from app.settings import Settings
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio
FAST = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)  # a cheap argon2id for tests


def make_service(store: Store, hasher: PasswordHasher = FAST, **settings: object) -> AccountService:
    """The service without a chat or an engine: enough for everything but deleting accounts."""
    values = {"secret_key": "k", "auth": "local", **settings}
    return AccountService(store, Settings(**values), Passwords(hasher), chat=None, engines=list)  # type: ignore[arg-type]


async def test_users_are_unique_by_name_and_keep_no_password_in_records(store: Store) -> None:
    alice = await store.accounts.create_user("alice", "hash-a", "admin")
    assert (alice.username, alice.role, alice.disabled, alice.has_password) == ("alice", "admin", False, True)
    assert len(alice.id) == 16 and alice.is_admin
    with pytest.raises(AccountConflict, match="the username 'alice' is taken"):
        await store.accounts.create_user("alice", "hash-b", "user")
    with pytest.raises(ValueError, match="role must be one of admin, user, got 'root'"):
        await store.accounts.create_user("carol", "h", "root")
    found = await store.accounts.user_credentials("alice")
    assert found == (alice, "hash-a")
    assert await store.accounts.user_credentials("nobody") is None
    assert [u.username for u in await store.accounts.list_users()] == ["alice"]


async def test_usernames_and_passwords_are_checked() -> None:
    assert normalize_username("  Alice.B@example.org ") == "alice.b@example.org"
    for bad in ("", "-x", "a b", "ä", "x" * 65, None):
        with pytest.raises(ValueError, match="username"):
            normalize_username(bad)
    assert check_password("12345678") == "12345678"
    with pytest.raises(ValueError, match="password must be 8 to 1024 characters, got 7"):
        check_password("1234567")


async def test_a_sign_in_ends_on_sign_out_expiry_password_change_and_disable(
    store: Store, db: TestDatabase
) -> None:
    alice = await store.accounts.create_user("alice", "h", "admin")
    bob = await store.accounts.create_user("bob", "h", "user")
    for name in ("s1", "s2", "s3"):
        await store.accounts.create_user_session(secret_hash(name), bob.id, "127.0.0.1", 3600)
    assert await store.accounts.session_user(secret_hash("s1")) == bob
    assert db.raw("SELECT id FROM user_sessions WHERE id LIKE 's%'") == []  # only digests are stored
    assert await store.accounts.revoke_user_session(secret_hash("s1")) is True
    assert await store.accounts.revoke_user_session(secret_hash("s1")) is False
    assert await store.accounts.session_user(secret_hash("s1")) is None
    assert await store.accounts.session_user(secret_hash("s2")) == bob
    await store.accounts.create_user_session(secret_hash("old"), bob.id, "127.0.0.1", -1)  # expired already
    assert await store.accounts.session_user(secret_hash("old")) is None
    assert (
        await store.accounts.set_password(bob.id, "h2", revoke=True) is True
    )  # a password change ends every sign-in
    assert await store.accounts.session_user(secret_hash("s2")) is None
    assert await store.accounts.session_user(secret_hash("s3")) is None
    await store.accounts.create_user_session(secret_hash("s4"), bob.id, "127.0.0.1", 3600)
    disabled = await store.accounts.update_user(bob.id, disabled=True)
    assert disabled is not None and disabled.disabled
    assert await store.accounts.session_user(secret_hash("s4")) is None
    await store.accounts.update_user(bob.id, disabled=False)
    assert await store.accounts.session_user(secret_hash("s4")) is None  # enabling again does not revive it
    assert await store.accounts.drop_expired_accounts_rows() == 1  # the expired one
    assert await store.accounts.update_user("missing", role="admin") is None
    assert (await store.accounts.get_user(alice.id)) == alice


async def test_the_last_enabled_admin_stays(store: Store) -> None:
    alice = await store.accounts.create_user("alice", "h", "admin")
    bob = await store.accounts.create_user("bob", "h", "user")
    for change in ({"role": "user"}, {"disabled": True}):
        with pytest.raises(AccountConflict, match="no enabled admin would be left"):
            await store.accounts.update_user(alice.id, **change)
    with pytest.raises(AccountConflict, match="last enabled admin"):
        await store.accounts.delete_user(alice.id, account_owner(alice.id))
    await store.accounts.update_user(bob.id, role="admin")
    assert (await store.accounts.update_user(alice.id, role="user")).role == "user"  # bob is admin now
    assert (await store.accounts.get_user(alice.id)).role == "user"


async def test_deleting_a_user_deletes_its_chats_presets_and_sign_ins_only(
    store: Store, db: TestDatabase
) -> None:
    await store.accounts.create_user("admin", "h", "admin")
    bob = await store.accounts.create_user("bob", "h", "user")
    carol = await store.accounts.create_user("carol", "h", "user")
    preset = await store.presets.create_preset(
        account_owner(bob.id), "Private", system_prompt="bob's notes", is_default=True
    )
    mine = await store.chats.create_session(account_owner(bob.id), title="bob's", preset_id=preset.id)
    await store.chats.add_message(mine.id, "user", "hello")
    theirs = await store.chats.create_session(account_owner(carol.id), title="carol's")
    kept = await store.presets.create_preset(account_owner(carol.id), "Private")
    await store.accounts.create_user_session(secret_hash("b"), bob.id, "127.0.0.1", 3600)
    assert await store.accounts.delete_user(bob.id, account_owner(bob.id)) is True
    assert await store.accounts.delete_user(bob.id, account_owner(bob.id)) is False
    assert await store.chats.list_sessions(account_owner(bob.id)) == []
    assert db.raw(f"SELECT count(*) FROM messages WHERE session_id = '{mine.id}'") == [(0,)]
    assert db.raw("SELECT count(*) FROM user_sessions") == [(0,)]
    assert [s.id for s in await store.chats.list_sessions(account_owner(carol.id))] == [theirs.id]
    # a preset is the account's own text (a system prompt): it goes with the account, another account's stays
    assert db.raw("SELECT id FROM presets") == [(kept.id,)]


async def test_an_invite_creates_its_account_once_before_it_expires(store: Store) -> None:
    admin = await store.accounts.create_user("admin", "h", "admin")
    invite = await store.accounts.create_invite(secret_hash("t1"), "dave", "user", admin.id, 3600)
    assert (invite.username, invite.role) == ("dave", "user")
    assert await store.accounts.get_invite(secret_hash("t1")) == invite
    with pytest.raises(AccountConflict, match="taken"):
        await store.accounts.create_invite(secret_hash("t2"), "admin", "user", admin.id, 3600)
    dave = await store.accounts.accept_invite(secret_hash("t1"), "dave-hash")
    assert dave is not None and (dave.username, dave.role, dave.has_password) == ("dave", "user", True)
    assert await store.accounts.accept_invite(secret_hash("t1"), "again") is None  # one time
    assert await store.accounts.get_invite(secret_hash("t1")) is None
    await store.accounts.create_invite(secret_hash("t3"), "erin", "admin", admin.id, -1)
    assert await store.accounts.get_invite(secret_hash("t3")) is None  # expired
    assert await store.accounts.accept_invite(secret_hash("t3"), "h") is None
    await store.accounts.create_invite(secret_hash("t4"), "frank", "user", admin.id, 3600)
    await store.accounts.create_user("frank", "h", "user")  # the name was taken meanwhile
    with pytest.raises(AccountConflict):
        await store.accounts.accept_invite(secret_hash("t4"), "h")


async def test_oidc_identities_are_keyed_by_issuer_and_subject(store: Store) -> None:
    await store.accounts.create_user("alice", "h", "admin")
    first = await store.accounts.oidc_user("https://idp", "sub-1", ["alice", "oidc-1"])
    assert (first.username, first.has_password, first.oidc_issuer) == ("oidc-1", False, "https://idp")
    again = await store.accounts.oidc_user("https://idp", "sub-1", ["newname"])
    assert again == first  # the same identity, whatever name it now prefers
    other = await store.accounts.oidc_user("https://other-idp", "sub-1", ["bob"])
    assert other.id != first.id and other.username == "bob"


async def test_argon2id_hashes_verify_and_are_rehashed_when_the_parameters_change(store: Store) -> None:
    old = make_service(store)
    stored = await old.passwords.hash("correct horse")
    assert stored.startswith("$argon2id$v=19$m=1024,t=1,p=1$")
    assert await old.passwords.verify(stored, "correct horse")
    assert not await old.passwords.verify(stored, "wrong horse")
    # an unknown user: the dummy hash, never a match
    assert not await old.passwords.verify(None, "correct horse")
    assert not await old.passwords.verify("not-a-hash", "correct horse")
    user = await store.accounts.create_user("alice", stored, "admin")
    signed = await old.sign_in("alice", "correct horse", "127.0.0.1")
    assert signed.user == user and len(signed.secret) >= 43
    assert (await store.accounts.user_credentials("alice"))[1] == stored  # same parameters: kept
    stronger = make_service(store, PasswordHasher(time_cost=2, memory_cost=2048, parallelism=1))
    assert stronger.passwords.needs_rehash(stored)
    await stronger.sign_in("ALICE", "correct horse", "127.0.0.1")
    rehashed = (await store.accounts.user_credentials("alice"))[1]
    assert rehashed.startswith("$argon2id$v=19$m=2048,t=2,p=1$") and not stronger.passwords.needs_rehash(
        rehashed
    )
    assert (await stronger.current(signed.secret)).user == user  # a rehash ends no sign-in
    for service in (old, stronger):
        service.passwords.close()


async def test_sign_in_refusals_say_what_is_wrong(store: Store) -> None:
    service = make_service(store)
    await store.accounts.create_user("alice", await service.passwords.hash("correct horse"), "admin")
    bob = await store.accounts.create_user("bob", await service.passwords.hash("battery staple"), "user")
    for name, password in (("alice", "wrong"), ("nobody", "correct horse"), ("not valid!", "x")):
        with pytest.raises(APIError) as refused:
            await service.sign_in(name, password, "127.0.0.1")
        assert (refused.value.status, refused.value.message) == (401, "wrong username or password")
    await store.accounts.update_user(bob.id, disabled=True)
    with pytest.raises(APIError, match="this account is disabled") as refused:
        await service.sign_in("bob", "battery staple", "127.0.0.1")
    assert refused.value.status == 403
    signed = await service.sign_in("alice", "correct horse", "127.0.0.1")
    account = await service.current(signed.secret)
    with pytest.raises(APIError, match="the current password is wrong"):
        await service.change_password(account, "nope", "new password 1", "127.0.0.1")
    fresh = await service.change_password(account, "correct horse", "new password 1", "127.0.0.1")
    assert await service.current(signed.secret) is None  # the old sign-in ended
    assert (await service.current(fresh.secret)).user.username == "alice"
    service.passwords.close()

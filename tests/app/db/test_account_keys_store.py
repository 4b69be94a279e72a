"""Invites that die with their creator's admin role, listed and revoked; per-account API keys in the store and the
service: made, listed, revoked, looked up by their hash, refused once revoked or disabled; and `KeyWork`, which
ends what a revoked key runs. On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from app.accounts.api_keys import MAX_KEYS_PER_ACCOUNT, REMEMBER_REVOKED_S, ApiKeyService, KeyWork, key_hash
from app.accounts.service import secret_hash
from app.db import AccountConflict, Store, UserRecord
from app.http.errors import APIError
from app.http.identity import KEY_PREFIX, KeyAccount

pytestmark = pytest.mark.anyio


async def test_an_invite_dies_when_its_creator_is_demoted_disabled_or_deleted(store: Store) -> None:
    root = await store.accounts.create_user(
        "root", "h", "admin"
    )  # stays: the last enabled admin is never touched
    for change in ("demote", "disable", "delete"):
        eve = await store.accounts.create_user(f"eve-{change}", "h", "admin")
        await store.accounts.create_invite(secret_hash(change), f"sock-{change}", "admin", eve.id, 3600)
        await store.accounts.create_invite(
            secret_hash(change + "-user"), f"user-{change}", "user", eve.id, 3600
        )
        assert (await store.accounts.get_invite(secret_hash(change))).created_by == eve.username
        if change == "demote":
            await store.accounts.update_user(eve.id, role="user")
        elif change == "disable":
            await store.accounts.update_user(eve.id, disabled=True)
        else:
            assert await store.accounts.delete_user(eve.id, f"user:{eve.id}")
        for token in (change, change + "-user"):  # a user invite too: only an admin may invite
            assert await store.accounts.get_invite(secret_hash(token)) is None
            assert await store.accounts.accept_invite(secret_hash(token), "h") is None
    assert [u.username for u in await store.accounts.list_users()] == ["eve-demote", "eve-disable", "root"]
    assert await store.accounts.list_invites() == []
    assert root.is_admin


async def test_an_invite_of_a_creator_changed_behind_the_stores_back_is_refused(store: Store, db) -> None:
    """The acceptance checks the creator itself (in its transaction), not only the invites a demotion deletes."""
    eve = await store.accounts.create_user("eve", "h", "admin")
    await store.accounts.create_user("root", "h", "admin")
    await store.accounts.create_invite(secret_hash("t"), "sock", "admin", eve.id, 3600)
    db.raw("UPDATE users SET role = 'user' WHERE id = :id", {"id": eve.id})  # as another process might
    assert await store.accounts.accept_invite(secret_hash("t"), "h") is None
    db.raw("UPDATE users SET role = 'admin' WHERE id = :id", {"id": eve.id})
    sock = await store.accounts.accept_invite(secret_hash("t"), "h")
    assert sock is not None and (sock.username, sock.role) == ("sock", "admin")


async def test_admins_list_and_revoke_pending_invites(store: Store) -> None:
    root = await store.accounts.create_user("root", "h", "admin")
    later = await store.accounts.create_invite(secret_hash("a"), "amy", "user", root.id, 7200)
    sooner = await store.accounts.create_invite(secret_hash("b"), "ben", "admin", root.id, 3600)
    await store.accounts.create_invite(secret_hash("c"), "cal", "user", root.id, -1)  # expired: not pending
    await store.accounts.create_invite(secret_hash("d"), "dan", "user", root.id, 3600)
    assert await store.accounts.accept_invite(secret_hash("d"), "h") is not None  # used: not pending
    listed = await store.accounts.list_invites()
    assert [(i.username, i.role, i.created_by) for i in listed] == [
        ("ben", "admin", "root"),
        ("amy", "user", "root"),
    ]
    assert [i.id for i in listed] == [sooner.id, later.id] == [secret_hash("b"), secret_hash("a")]
    assert await store.accounts.revoke_invite(sooner.id)
    assert not await store.accounts.revoke_invite(sooner.id)
    assert not await store.accounts.revoke_invite(secret_hash("d"))  # a used invite is no pending one
    assert await store.accounts.accept_invite(secret_hash("b"), "h") is None
    assert [i.username for i in await store.accounts.list_invites()] == ["amy"]


async def test_keys_are_made_listed_revoked_and_found_by_their_hash_only(store: Store, db) -> None:
    keys = ApiKeyService(store)
    alice = await store.accounts.create_user("alice", "h", "user")
    await store.accounts.create_user("root", "h", "admin")
    bob = await store.accounts.create_user("bob", "h", "user")
    first = await keys.create(alice, "  laptop  ")
    second = await keys.create(alice, "ci")
    assert first.secret.startswith(KEY_PREFIX) and len(first.secret) == 47
    assert (first.record.name, first.record.prefix) == ("laptop", first.secret[:12])
    stored = db.raw("SELECT secret_hash, prefix FROM api_keys ORDER BY created_at, id")
    assert first.secret not in str(stored) and (key_hash(first.secret), first.secret[:12]) in stored
    assert [k.name for k in await keys.list_keys(alice)] == ["laptop", "ci"]
    assert await keys.list_keys(bob) == []
    assert await keys.authenticate(first.secret) == KeyAccount(alice, first.record.id)
    assert await keys.api_key_live(first.record.id)
    with pytest.raises(APIError) as wrong:
        await keys.authenticate(KEY_PREFIX + "x" * 43)
    assert (wrong.value.status, wrong.value.code) == (401, "invalid_api_key")
    with pytest.raises(APIError) as other:  # bob cannot revoke alice's key
        await keys.revoke(bob, first.record.id)
    assert (other.value.status, other.value.code) == (404, "not_found")
    assert await keys.revoke(alice, first.record.id) == 0
    with pytest.raises(APIError) as revoked:
        await keys.authenticate(first.secret)
    assert (revoked.value.status, revoked.value.code) == (401, "api_key_revoked")
    assert not await keys.api_key_live(first.record.id)
    assert [k.name for k in await keys.list_keys(alice)] == ["ci"]
    await store.accounts.update_user(alice.id, disabled=True)  # disabling revokes every key of the account
    assert not await keys.api_key_live(second.record.id)
    with pytest.raises(APIError) as disabled:
        await keys.authenticate(second.secret)
    assert disabled.value.code == "api_key_revoked"
    bobs = await keys.create(bob, "bob's")
    assert await store.accounts.set_password(bob.id, "h2", revoke=False)  # a rehash at sign-in keeps them
    assert await keys.api_key_live(bobs.record.id)
    kept = await keys.create(bob, "kept")
    assert await store.accounts.set_password(bob.id, "h3", revoke=True)  # a password change revokes them
    assert not await keys.api_key_live(bobs.record.id) and not await keys.api_key_live(kept.record.id)
    bobs = await keys.create(bob, "after")
    assert await store.accounts.delete_user(bob.id, f"user:{bob.id}")  # its keys go with it
    with pytest.raises(APIError) as gone:
        await keys.authenticate(bobs.secret)
    assert gone.value.code == "invalid_api_key"


async def test_key_names_and_the_number_of_keys_are_limited(store: Store) -> None:
    keys = ApiKeyService(store)
    carol = await store.accounts.create_user("carol", "h", "user")
    for bad, message in (
        (None, "name the key: send name as a non-empty string"),
        ("   ", "name the key: send name as a non-empty string"),
        ("x" * 65, "name must be at most 64 printable characters, got 65"),
        ("tab\there", "name must be at most 64 printable characters, got 8"),
    ):
        with pytest.raises(APIError) as refused:
            await keys.create(carol, bad)
        assert (refused.value.status, refused.value.param, refused.value.message) == (400, "name", message)
    made = [await keys.create(carol, f"k{i}") for i in range(MAX_KEYS_PER_ACCOUNT)]
    with pytest.raises(APIError) as full:
        await keys.create(carol, "one more")
    assert (full.value.status, full.value.code) == (409, "too_many_api_keys")
    assert f"the most it may have is {MAX_KEYS_PER_ACCOUNT}" in full.value.message
    await keys.revoke(carol, made[0].record.id)
    await keys.create(carol, "one more")  # a revoked key frees its place
    await store.accounts.update_user(carol.id, disabled=True)
    with pytest.raises(AccountConflict, match="disabled"):
        await store.accounts.create_api_key(carol.id, "n", "pck_x", "h" * 64, MAX_KEYS_PER_ACCOUNT)


async def test_key_work_ends_what_a_revoked_key_runs_and_what_starts_after() -> None:
    now = [0.0]
    work = KeyWork(clock=lambda: now[0])
    alice = KeyAccount(user=_user("a"), key_id="k1")
    other = KeyAccount(user=_user("a"), key_id="k2")
    ended: list[str] = []
    running = {"r1": True, "r2": True, "r3": False, "r4": True}

    def track(key: KeyAccount, name: str) -> None:
        work.track(key, lambda: running[name], lambda: ended.append(name))

    track(alice, "r1")
    track(alice, "r3")  # finished: dropped when the key starts something else
    track(alice, "r2")
    track(other, "r4")
    assert work.num_running("k1") == 2
    assert work.end_key("k1") == 2 and ended == ["r1", "r2"]
    track(alice, "r1")  # authenticated before the revocation, registered after: ended at once
    assert ended == ["r1", "r2", "r1"]
    assert work.end_user("a") == 1 and ended[-1] == "r4"
    assert work.end_key("k2") == 0
    now[0] += REMEMBER_REVOKED_S + 1  # forgotten: the periodic credential check covers a stream this late
    track(alice, "r2")
    assert ended == ["r1", "r2", "r1", "r4"] and work.num_running("k1") == 1


def _user(user_id: str) -> UserRecord:
    return UserRecord(user_id, user_id, "user", datetime.now(timezone.utc), False, True, None)

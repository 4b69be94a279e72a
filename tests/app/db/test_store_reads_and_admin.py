"""Store: reads never wait behind a write that waits for a lock; admin sign-ins are rows that can be revoked."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text

from app.db import Store, StoreUnavailable
from tests.app.databases import TestDatabase
from tests.app.db.test_store import hold_write_lock, release

pytestmark = pytest.mark.anyio


async def test_reads_answer_while_a_write_waits_for_a_lock_held_elsewhere(db: TestDatabase) -> None:
    store = Store(db.url, busy_timeout_ms=1500)
    await store.start()
    session = await store.chats.create_session("alice", title="before the lock")
    holder, error = hold_write_lock(db)  # another process writes and holds the lock
    if db.is_sqlite:
        holder.execute("UPDATE chat_sessions SET title = 'uncommitted'")
    else:
        holder.execute(text("UPDATE chat_sessions SET title = 'uncommitted'"))
    try:
        write = asyncio.ensure_future(store.chats.create_session("alice", title="waits for the lock"))
        await asyncio.sleep(0.1)  # the writer thread is now waiting on the lock
        began = time.monotonic()
        await store.ping()
        listed = await store.chats.list_sessions("alice")
        messages = await store.chats.list_messages("alice", session.id)
        fetched = await store.chats.get_session("alice", session.id)
        took = time.monotonic() - began
        assert not write.done()
        with pytest.raises(StoreUnavailable, match=error):
            await write
    finally:
        release(holder)
    assert took < 0.5, f"reads waited {took:.2f} s behind the write"
    assert [s.title for s in listed] == ["before the lock"]  # the last committed state
    assert messages == [] and fetched == session
    await store.close()


async def test_an_in_memory_database_reads_on_the_writer() -> None:
    store = Store("sqlite://")
    await store.start()
    session = await store.chats.create_session("alice")
    assert [s.id for s in await store.chats.list_sessions("alice")] == [
        session.id
    ]  # one connection, one database
    await store.close()


async def test_admin_sign_ins_are_valid_until_revoked_expired_or_made_with_another_token(
    db: TestDatabase,
) -> None:
    store = Store(db.url)
    await store.start()
    await store.admin.create_admin_session("h-live", "fp-a", "203.0.113.9", 3600)
    await store.admin.create_admin_session("h-out", "fp-a", "127.0.0.1", 3600)
    await store.admin.create_admin_session("h-old", "fp-a", "127.0.0.1", -1)  # expired already
    await store.admin.create_admin_session("h-other", "fp-b", "127.0.0.1", 3600)
    assert await store.admin.admin_session_valid("h-live", "fp-a")
    assert not await store.admin.admin_session_valid("h-live", "fp-b")  # the token changed since
    assert not await store.admin.admin_session_valid("h-old", "fp-a")
    assert not await store.admin.admin_session_valid("nope", "fp-a")
    assert await store.admin.revoke_admin_session("h-out") is True
    assert await store.admin.revoke_admin_session("h-out") is False  # once
    assert not await store.admin.admin_session_valid("h-out", "fp-a")
    await store.close()

    again = Store(db.url)  # a restart keeps sign-ins and revocations
    await again.start()
    assert await again.admin.admin_session_valid("h-live", "fp-a")
    assert not await again.admin.admin_session_valid("h-out", "fp-a")
    assert (
        await again.admin.revoke_admin_sessions_except("fp-a") == 1
    )  # h-other, signed in with another token
    assert not await again.admin.admin_session_valid("h-other", "fp-b")
    assert sorted(db.raw("SELECT id, revoked_at IS NULL FROM admin_sessions")) == [
        ("h-live", 1),
        ("h-other", 0),
        ("h-out", 0),
    ]  # the expired one is gone
    assert await again.admin.revoke_admin_sessions_except(None) == 1  # no admin token any more: every one
    assert not await again.admin.admin_session_valid("h-live", "fp-a")
    await again.close()

"""Store: real databases (SQLite files in tmp_path, and PostgreSQL), owner isolation, ordering, cascades, recovery,
and outage errors."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.db import MessageRecord, Store, StoreUnavailable
from app.db.database import create_db_engine
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio


def make_url(tmp_path: Path, name: str = "chat.db") -> str:
    return f"sqlite:///{tmp_path / name}"


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    """A store on a SQLite file, for tests of what no database changes (threads, SQLite's own settings)."""
    s = Store(make_url(tmp_path))
    await s.start()
    yield s
    await s.close()


def raw(tmp_path: Path, sql: str, name: str = "chat.db") -> list[tuple]:
    """Run `sql` on a plain sqlite3 connection, outside the store."""
    conn = sqlite3.connect(tmp_path / name)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def finish(store: Store, message_id: int, content: str, ids: list[int]) -> None:
    await store.chats.finish_assistant(
        message_id,
        content=content,
        status="finished",
        finish_reason="stop",
        token_ids=ids,
        completion_tokens=len(ids),
        timings={"ttft": 0.25, "total": 1.5, "tokens_per_s": 2.0},
    )


async def test_sqlite_file_is_in_wal_mode_with_pragmas(sqlite_store: Store, tmp_path: Path) -> None:
    assert raw(tmp_path, "PRAGMA journal_mode") == [("wal",)]
    engine = create_db_engine(make_url(tmp_path), busy_timeout_ms=1234)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 1234
    engine.dispose()


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
async def test_postgresql_connections_wait_for_locks_as_long_as_the_busy_timeout(db: TestDatabase) -> None:
    engine = create_db_engine(db.url, busy_timeout_ms=1234)
    with engine.connect() as conn:
        assert conn.execute(text("SHOW lock_timeout")).scalar() == "1234ms"
        assert conn.execute(text("SHOW TimeZone")).scalar() == "UTC"
    assert (engine.pool.size(), engine.pool._max_overflow) == (5, 5)  # the store's writer and four readers
    engine.dispose()
    no_wait = create_db_engine(db.url, busy_timeout_ms=0)
    with no_wait.connect() as conn:
        assert conn.execute(text("SHOW lock_timeout")).scalar() == "1ms"  # 0 would mean: wait forever
    no_wait.dispose()


async def test_session_crud_and_owner_isolation(store: Store) -> None:
    settings = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 128}
    s = await store.chats.create_session("alice", title="Trip", system_prompt="Be brief.", settings=settings)
    assert (s.owner, s.title, s.system_prompt, s.settings) == ("alice", "Trip", "Be brief.", settings)
    assert len(s.id) == 22 and s.created_at == s.updated_at
    assert s.created_at.tzinfo is not None
    assert await store.chats.get_session("alice", s.id) == s
    # another owner sees nothing and can change nothing
    assert await store.chats.get_session("mallory", s.id) is None
    assert await store.chats.list_sessions("mallory") == []
    assert await store.chats.update_session("mallory", s.id, title="pwned") is None
    assert await store.chats.list_messages("mallory", s.id) is None
    assert await store.chats.delete_session("mallory", s.id) is False
    assert (await store.chats.get_session("alice", s.id)).title == "Trip"

    updated = await store.chats.update_session(
        "alice", s.id, title="Trip to Oslo", settings={"temperature": 0.0}
    )
    assert updated is not None
    assert (updated.title, updated.system_prompt, updated.settings) == (
        "Trip to Oslo",
        "Be brief.",
        {"temperature": 0.0},
    )
    assert updated.updated_at > s.updated_at and updated.created_at == s.created_at
    assert await store.chats.delete_session("alice", s.id) is True
    assert await store.chats.get_session("alice", s.id) is None
    assert await store.chats.delete_session("alice", s.id) is False
    assert await store.chats.update_session("alice", "no-such-id", title="x") is None


async def test_sessions_listed_most_recently_updated_first(store: Store) -> None:
    a = await store.chats.create_session("alice", title="a")
    b = await store.chats.create_session("alice", title="b")
    c = await store.chats.create_session("alice", title="c")
    await store.chats.create_session("bob", title="other")
    assert [s.title for s in await store.chats.list_sessions("alice")] == ["c", "b", "a"]
    await store.chats.add_message(a.id, "user", "bump")
    assert [s.title for s in await store.chats.list_sessions("alice")] == ["a", "c", "b"]
    await store.chats.update_session("alice", b.id, system_prompt="x")
    assert [s.id for s in await store.chats.list_sessions("alice")] == [b.id, a.id, c.id]


async def test_messages_keep_order_ids_and_fields(store: Store) -> None:
    s = await store.chats.create_session("alice")
    u = await store.chats.add_message(s.id, "user", "Hello", token_ids=[1, 9038, 2])
    assert (u.position, u.role, u.content, u.token_ids, u.status) == (
        0,
        "user",
        "Hello",
        (1, 9038, 2),
        "complete",
    )
    a = await store.chats.start_assistant(
        s.id, prompt_tokens=3, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="f00d"
    )
    assert (a.position, a.role, a.content, a.status, a.token_ids) == (1, "assistant", "", "streaming", None)
    assert (a.prompt_tokens, a.cached_tokens, a.truncated_turns, a.tokenizer_fingerprint) == (3, 0, 0, "f00d")
    await store.chats.flush_assistant(a.id, "Hi th")
    assert (await store.chats.list_messages("alice", s.id))[1].content == "Hi th"
    await finish(store, a.id, "Hi there", [22, 23, 2])
    await store.chats.flush_assistant(a.id, "late flush is ignored")
    msgs = await store.chats.list_messages("alice", s.id)
    assert [m.position for m in msgs] == [0, 1]
    done = msgs[1]
    assert isinstance(done, MessageRecord)
    assert (done.content, done.status, done.finish_reason, done.token_ids, done.completion_tokens) == (
        "Hi there",
        "finished",
        "stop",
        (22, 23, 2),
        3,
    )
    assert done.timings == {"ttft": 0.25, "total": 1.5, "tokens_per_s": 2.0}
    assert done.error is None and done.prompt_tokens == 3
    third = await store.chats.add_message(s.id, "user", "More?")
    assert third.position == 2 and third.token_ids is None


async def test_delete_messages_from_removes_the_tail(store: Store) -> None:
    s = await store.chats.create_session("alice")
    other = await store.chats.create_session("alice")
    msgs = [await store.chats.add_message(s.id, "user", f"m{i}") for i in range(5)]
    foreign = await store.chats.add_message(other.id, "user", "keep me")
    assert await store.chats.delete_messages_from(other.id, msgs[2].id) == 0  # message of another session
    assert await store.chats.delete_messages_from(s.id, msgs[2].id) == 3
    assert [m.content for m in await store.chats.list_messages("alice", s.id)] == ["m0", "m1"]
    assert await store.chats.delete_messages_from(s.id, msgs[2].id) == 0  # already gone
    assert (await store.chats.add_message(s.id, "user", "edited")).position == 2
    assert [m.id for m in await store.chats.list_messages("alice", other.id)] == [foreign.id]


async def test_deleting_a_session_cascades_to_its_messages(store: Store, db: TestDatabase) -> None:
    s = await store.chats.create_session("alice")
    keep = await store.chats.create_session("alice")
    for i in range(3):
        await store.chats.add_message(s.id, "user", f"m{i}")
    await store.chats.add_message(keep.id, "user", "stays")
    assert db.raw("SELECT count(*) FROM messages") == [(4,)]
    assert await store.chats.delete_session("alice", s.id) is True
    assert db.raw("SELECT session_id, content FROM messages") == [(keep.id, "stays")]
    # a streaming answer whose session vanished finishes quietly
    a = await store.chats.start_assistant(
        keep.id, prompt_tokens=1, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="f"
    )
    assert await store.chats.delete_session("alice", keep.id) is True
    await finish(store, a.id, "orphan", [5])
    assert db.raw("SELECT count(*) FROM messages") == [(0,)]


async def test_start_marks_streaming_answers_interrupted(db: TestDatabase) -> None:
    first = Store(db.url)
    await first.start()
    s = await first.chats.create_session("alice")
    await first.chats.add_message(s.id, "user", "q")
    a = await first.chats.start_assistant(
        s.id, prompt_tokens=1, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="f"
    )
    await first.chats.flush_assistant(a.id, "partial ans")
    done = await first.chats.start_assistant(
        s.id, prompt_tokens=1, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="f"
    )
    await finish(first, done.id, "whole", [7])
    await first.close()  # as if the process died mid-stream: the row stays 'streaming'

    second = Store(db.url)
    await second.start()
    msgs = await second.chats.list_messages("alice", s.id)
    assert [(m.status, m.content) for m in msgs] == [
        ("complete", "q"),
        ("interrupted", "partial ans"),
        ("finished", "whole"),
    ]
    await second.close()
    if db.is_sqlite:
        assert db.raw("PRAGMA integrity_check") == [("ok",)]
        assert db.raw("PRAGMA foreign_key_check") == []


async def test_bad_arguments_raise(store: Store) -> None:
    s = await store.chats.create_session("alice")
    with pytest.raises(ValueError, match="role must be one of"):
        await store.chats.add_message(s.id, "tool", "x")
    with pytest.raises(ValueError, match="status of a user message must be one of"):
        await store.chats.add_message(s.id, "user", "x", status="finished")
    with pytest.raises(ValueError, match="title must be a string of at most 200"):
        await store.chats.create_session("alice", title="t" * 201)
    with pytest.raises(ValueError, match="owner must be a string of 1 to 128"):
        await store.chats.create_session("")
    with pytest.raises(ValueError, match="status must be one of"):
        await store.chats.finish_assistant(
            1,
            content="",
            status="complete",
            finish_reason=None,
            token_ids=[],
            completion_tokens=0,
            timings={},
        )
    with pytest.raises(LookupError, match="does not exist"):
        await store.chats.add_message("missing-session", "user", "x")
    with pytest.raises(RuntimeError, match="start"):
        await Store("sqlite://").chats.list_sessions("alice")
    # PostgreSQL's text cannot hold NUL: no backend takes it from a client, and a model's is replaced
    with pytest.raises(
        ValueError, match=r"content must not contain NUL characters \(U\+0000\), found at index 2"
    ):
        await store.chats.add_message(s.id, "user", "ab\x00c")
    with pytest.raises(ValueError, match="title must not contain NUL"):
        await store.chats.update_session("alice", s.id, title="\x00")
    with pytest.raises(ValueError, match="system_prompt must not contain NUL"):
        await store.chats.create_session("alice", system_prompt="\x00")
    with pytest.raises(ValueError, match="name must not contain NUL"):
        await store.presets.create_preset("alice", "a\x00")
    a = await store.chats.start_assistant(
        s.id, prompt_tokens=1, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="f"
    )
    await store.chats.flush_assistant(a.id, "half\x00")
    assert (await store.chats.list_messages("alice", s.id))[-1].content == "half\ufffd"
    await finish(store, a.id, "whole\x00", [1])
    assert (await store.chats.list_messages("alice", s.id))[-1].content == "whole\ufffd"


async def test_unwritable_path_raises_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("a file where a directory should be")
    s = Store(f"sqlite:///{tmp_path / 'not-a-dir' / 'chat.db'}")
    with pytest.raises(StoreUnavailable, match="unable to open database file"):
        await s.start()
    with pytest.raises(RuntimeError):  # start failed: the store is not running
        await s.ping()


async def test_unreachable_postgresql_raises_store_unavailable() -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")
    with socket.socket() as probe:  # a loopback port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = Store(f"postgresql+psycopg://pagedchat:secret@127.0.0.1:{port}/chat")
    with pytest.raises(
        StoreUnavailable, match=r"database unavailable \(postgresql\+psycopg://pagedchat:\*\*\*@"
    ):
        await s.start()
    with pytest.raises(RuntimeError):  # start failed: the store is not running
        await s.ping()


def test_postgresql_urls_go_through_psycopg_and_say_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[postgres]')")
    engine = create_db_engine("postgresql://pagedchat:secret@127.0.0.1:1/chat")  # connects lazily
    assert (engine.url.drivername, engine.url.password) == ("postgresql+psycopg", "secret")
    engine.dispose()
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if it were not installed
    with pytest.raises(
        RuntimeError, match=r"needs the Python driver 'psycopg'.*pip install -e '\.\[postgres\]'"
    ):
        create_db_engine("postgresql+psycopg://pagedchat:secret@127.0.0.1:1/chat")


def hold_write_lock(db: TestDatabase) -> tuple[Any, str]:
    """Another connection holding a lock that keeps every write of the store waiting (reads go on); the error the
    store's writes then end with."""
    if db.is_sqlite:
        holder = sqlite3.connect(db.path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        return holder, "database is locked"
    holder = db.engine().connect()
    holder.begin()
    holder.execute(text("LOCK TABLE chat_sessions IN EXCLUSIVE MODE"))  # SELECT still runs; INSERT waits
    return holder, "lock timeout"


def release(holder: Any) -> None:
    holder.rollback()
    holder.close()


async def test_locked_database_raises_store_unavailable_without_blocking_the_loop(
    store: Store, db: TestDatabase
) -> None:
    await store.ping()
    locked = Store(db.url, busy_timeout_ms=300)
    await locked.start()
    holder, error = hold_write_lock(db)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        with pytest.raises(StoreUnavailable, match=error):
            await locked.chats.create_session("alice")
    finally:
        ticker.cancel()
        release(holder)
    assert ticks >= 10, f"the event loop stalled while the store waited on the lock ({ticks} ticks)"
    assert (await locked.chats.create_session("alice")).owner == "alice"  # usable again once the lock is gone
    await locked.close()


async def test_database_work_runs_off_the_event_loop_thread(sqlite_store: Store) -> None:
    seen: list[str] = []
    store = sqlite_store
    await store._call(lambda: seen.append(threading.current_thread().name))
    assert seen[0].startswith("pagedchat-store") and seen[0] != threading.current_thread().name


def test_each_feature_store_is_its_queries_bound_and_nothing_written_twice() -> None:
    """A feature store's methods are its module's synchronous functions bound by `reads`/`writes` (no async twin
    written by hand), each keeping its function's docstring."""
    from app.db.account_store import AccountStore
    from app.db.admin_sessions import AdminStore
    from app.db.presets import PresetStore
    from app.db.queries import ChatStore
    from app.db.threads import Bound

    for cls in (ChatStore, PresetStore, AccountStore, AdminStore):
        own = {name: value for name, value in vars(cls).items() if not name.startswith("__")}
        assert own and all(isinstance(value, Bound) for value in own.values()), cls.__name__
        assert all(value.fn.__doc__ for value in own.values()), cls.__name__


async def test_a_bound_write_runs_on_the_writer_and_a_read_on_a_reader(sqlite_store: Store) -> None:
    from app.db.queries import ChatStore
    from app.db.threads import reads, writes

    seen: list[str] = []

    def where(s, label: str) -> str:
        """Which thread ran it."""
        seen.append(threading.current_thread().name)
        return label

    class Probe(ChatStore):
        read_here = reads(where)
        write_here = writes(where)

    probe = Probe(sqlite_store)
    assert await probe.read_here("r") == "r" and await probe.write_here(label="w") == "w"
    assert probe.read_here.__doc__ == "Which thread ran it."
    assert seen[0].startswith("pagedchat-store-read") and seen[1].startswith("pagedchat-store")
    assert not seen[1].startswith("pagedchat-store-read")

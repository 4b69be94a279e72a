"""Migration 0005 (the message tree) on databases made by the previous schema, SQLite and PostgreSQL: each linear
history becomes a chain without losing a field, and the downgrade keeps each session's active branch. And every step
of the chain from 0002, up and down, keeps every chat and message."""

from __future__ import annotations

import json

import pytest
from alembic import command
from alembic.script import ScriptDirectory

from app.db import Store
from app.db.database import alembic_config
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio
NOW = "2026-01-01 00:00:00"
MESSAGE_COLUMNS = (
    "id, session_id, position, role, content, token_ids, status, finish_reason, prompt_tokens, "
    "completion_tokens, cached_tokens, truncated_turns, timings, tokenizer_fingerprint, error, created_at, "
    "updated_at"
)
SESSIONS = [("s-linear", "alice"), ("s-empty", "alice"), ("s-gaps", "alice"), ("s-other", "key:bob")]
# (id, session, position, role, content, token ids, status, finish_reason, prompt, completion, cached, error)
MESSAGES = [
    (1, "s-linear", 0, "user", "Hi", [1, 2, 3], "complete", None, None, None, None, None),
    (2, "s-linear", 1, "assistant", "Hello!", [40, 41, 2], "finished", "stop", 3, 3, 0, None),
    (5, "s-other", 0, "user", "Other owner", [9], "complete", None, None, None, None, None),
    (3, "s-linear", 2, "user", "Tell more", [4, 5], "complete", None, None, None, None, None),
    (4, "s-linear", 3, "assistant", "Once upon", [42, 43], "stopped", "abort", 8, 2, 0, None),
    (6, "s-linear", 4, "user", "Again", None, "complete", None, None, None, None, None),
    (7, "s-linear", 5, "assistant", "", None, "failed", None, 12, 0, 0, "engine failed"),
    # positions with gaps (an old edit deleted the turns between them)
    (10, "s-gaps", 0, "user", "Q1", [1], "complete", None, None, None, None, None),
    (11, "s-gaps", 3, "assistant", "A1", [2], "interrupted", "abort", 1, 1, 0, None),
    (14, "s-gaps", 7, "user", "Q2", [3], "complete", None, None, None, None, None),
    (8, "s-other", 1, "assistant", "Long answer", [50] * 20, "finished", "length", 1, 20, 0, None),
]


def make_db_at_0002(db: TestDatabase) -> str:
    """A database built and filled by the schema before the tree (revision 0002)."""
    command.upgrade(alembic_config(db.url), "0002")
    for sid, owner in SESSIONS:
        db.raw(
            "INSERT INTO chat_sessions VALUES (:sid, :owner, 'title', 'system', '{\"temperature\": 0}', :now, :now)",
            {"sid": sid, "owner": owner, "now": NOW},
        )
    names = [c.strip() for c in MESSAGE_COLUMNS.split(",")]
    insert = f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES ({', '.join(':' + n for n in names)})"
    for m in MESSAGES:
        mid, sid, pos, role, content, ids, status, reason, prompt, completion, cached, error = m
        values = (mid, sid, pos, role, content, None if ids is None else json.dumps(ids), status, reason)
        values += (prompt, completion, cached, 0, json.dumps({"ttft_s": 0.5}), "fp", error, NOW, NOW)
        db.raw(insert, dict(zip(names, values)))
    if not db.is_sqlite:  # the rows came with their ids, as a restore brings them: the sequence follows
        db.raw("SELECT setval('messages_id_seq', (SELECT max(id) FROM messages))")
    return db.url


async def test_linear_histories_become_chains_without_loss(empty_db: TestDatabase) -> None:
    db = empty_db
    url = make_db_at_0002(db)
    before = db.raw(f"SELECT {MESSAGE_COLUMNS} FROM messages ORDER BY id")
    command.upgrade(alembic_config(url), "head")
    assert db.raw(f"SELECT {MESSAGE_COLUMNS} FROM messages ORDER BY id") == before  # nothing else moved
    assert db.raw("SELECT id, parent_id FROM messages ORDER BY id") == [
        (1, None),
        (2, 1),
        (3, 2),
        (4, 3),
        (5, None),
        (6, 4),
        (7, 6),
        (8, 5),
        (10, None),
        (11, 10),
        (14, 11),
    ]
    assert db.raw("SELECT id, active_leaf_id FROM chat_sessions ORDER BY id") == [
        ("s-empty", None),
        ("s-gaps", 14),
        ("s-linear", 7),
        ("s-other", 8),
    ]

    store = Store(url)
    await store.start()  # already at head: the store reads the migrated rows as branches
    path = await store.chats.list_messages("alice", "s-linear")
    assert [(m.id, m.role, m.status, m.token_ids) for m in path] == [
        (1, "user", "complete", (1, 2, 3)),
        (2, "assistant", "finished", (40, 41, 2)),
        (3, "user", "complete", (4, 5)),
        (4, "assistant", "stopped", (42, 43)),
        (6, "user", "complete", None),
        (7, "assistant", "failed", None),
    ]
    assert path[-1].error == "engine failed" and path[1].timings == {"ttft_s": 0.5}
    assert [m.content for m in await store.chats.list_messages("key:bob", "s-other")] == [
        "Other owner",
        "Long answer",
    ]
    assert await store.chats.list_messages("alice", "s-empty") == []
    tree = await store.chats.get_tree("alice", "s-gaps")
    assert tree is not None and [tree.sibling_ids(m.id) for m in tree.active_path()] == [(10,), (11,), (14,)]
    # the migrated chain grows as a tree: a regenerated first reply is a sibling of the old one
    again = await store.chats.start_assistant(
        "s-gaps",
        prompt_tokens=1,
        cached_tokens=0,
        truncated_turns=0,
        tokenizer_fingerprint="fp",
        parent_id=10,
    )
    assert (await store.chats.get_tree("alice", "s-gaps")).sibling_ids(11) == (11, again.id)
    await store.close()


async def test_the_downgrade_keeps_each_active_branch(empty_db: TestDatabase) -> None:
    db = empty_db
    url = make_db_at_0002(db)
    command.upgrade(alembic_config(url), "head")
    store = Store(url)
    await store.start()
    await store.chats.add_message(
        "s-linear", "user", "Tell more, edited", parent_id=2
    )  # a second branch, on show
    await store.chats.switch_branch("key:bob", "s-other", 5)
    await store.chats.add_message("s-gaps", "user", "Q1 again", parent_id=None)
    await store.chats.switch_branch("alice", "s-gaps", 10)  # the first version is on show again
    await store.close()
    command.downgrade(alembic_config(url), "0002")
    assert "parent_id" not in db.columns("messages") and "active_leaf_id" not in db.columns("chat_sessions")
    kept = db.raw("SELECT session_id, content FROM messages ORDER BY session_id, position")
    assert kept == [
        ("s-gaps", "Q1"),
        ("s-gaps", "A1"),
        ("s-gaps", "Q2"),
        ("s-linear", "Hi"),
        ("s-linear", "Hello!"),
        ("s-linear", "Tell more, edited"),
        ("s-other", "Other owner"),
        ("s-other", "Long answer"),
    ]


def test_each_step_of_the_chain_keeps_every_chat_and_message(empty_db: TestDatabase) -> None:
    """0002 up to head and back, one revision at a time, with foreign keys on (as the app migrates): no step may
    lose a row, as a batch copy of chat_sessions would (dropping the old table cascades to every message)."""
    db = empty_db
    url = make_db_at_0002(db)
    cfg = alembic_config(url)
    chats = "SELECT id, owner, title, system_prompt, settings, created_at FROM chat_sessions ORDER BY id"
    messages = f"SELECT {MESSAGE_COLUMNS} FROM messages ORDER BY id"
    stored = (db.raw(chats), db.raw(messages))
    chain = [s.revision for s in reversed(list(ScriptDirectory.from_config(cfg).walk_revisions()))]
    after_0002 = chain[chain.index("0002") + 1 :]
    assert after_0002, chain
    for revision in after_0002:
        command.upgrade(cfg, revision)
        assert (db.raw(chats), db.raw(messages)) == stored, f"upgrade to {revision}"
    for revision in reversed(chain[chain.index("0002") : -1]):
        command.downgrade(cfg, revision)
        assert (db.raw(chats), db.raw(messages)) == stored, f"downgrade to {revision}"
    if db.is_sqlite:
        assert db.raw("PRAGMA foreign_key_check") == []

"""A search reads the owner's own messages before it matches words, so its time does not tell how common a word is
in other users' chats (issue #35, item 12): shown by the query plans (SQLite's EXPLAIN QUERY PLAN, PostgreSQL's
EXPLAIN), and SQLite's owner-keyed index kept in step when a chat changes owner or a message moves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text as sql

from app.db import Store
from app.db.database import create_db_engine, upgrade_to_head
from app.db.pg_search import _page_sql, _tsquery_sql
from app.db.search import _FTS5_PAGE, KEY_SHIFT
from app.db.search_query import parse_search, tsquery_terms
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio
NOW = "2026-01-01 00:00:00"
WORD = "lighthouse"


def fill(db: TestDatabase, owner: str, num_chats: int, content: str, per_chat: int = 1) -> None:
    """`num_chats` chats of `owner`, each with `per_chat` finished messages of `content` (plain SQL: fast)."""
    sessions = [{"id": f"{owner}-{i}", "owner": owner, "now": NOW} for i in range(num_chats)]
    messages = [
        {"sid": f"{owner}-{i}", "position": p, "content": content, "now": NOW}
        for i in range(num_chats)
        for p in range(per_chat)
    ]
    with db.engine().begin() as conn:
        conn.execute(
            sql(
                "INSERT INTO chat_sessions (id, owner, title, system_prompt, settings, created_at, updated_at) "
                "VALUES (:id, :owner, 't', '', '{}', :now, :now)"
            ),
            sessions,
        )
        conn.execute(
            sql(
                "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
                "VALUES (:sid, :position, 'user', :content, 'finished', :now, :now)"
            ),
            messages,
        )


@pytest.fixture
def crowded(db: TestDatabase) -> Iterator[TestDatabase]:
    """alice: three chats, none with the word; mallory: 2,000 messages with it."""
    if db.is_sqlite:  # a new SQLite file: the store would migrate it at its start
        engine = create_db_engine(db.url)
        upgrade_to_head(engine)
        engine.dispose()
    fill(db, "alice", 3, "how tall is the tallest tree")
    fill(db, "mallory", 200, f"the {WORD} keeper lit the lamp", per_chat=10)
    if not db.is_sqlite:
        with db.engine().connect() as conn:  # statistics, as autovacuum would have them
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(sql("ANALYZE"))
    yield db


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_sqlite_hands_the_owners_rowid_range_to_the_full_text_index(crowded: TestDatabase) -> None:
    params = {"match": f'"{WORD}"', "owner": "alice", "limit": 21, "offset": 0}
    with crowded.engine().connect() as conn:
        plan = [row[3] for row in conn.execute(sql("EXPLAIN QUERY PLAN " + str(_FTS5_PAGE)), params)]
    [fts] = [line for line in plan if "messages_fts VIRTUAL TABLE" in line]
    constraints = fts.rsplit(":", 1)[
        1
    ]  # FTS5's idxStr: M the match, > and < the rowid's lower and upper bound
    assert "M" in constraints and ">" in constraints and "<" in constraints, plan
    bounds = [line for line in plan if line.startswith("SEARCH search_owners")]
    assert bounds and all("(owner=?)" in line for line in bounds), plan  # the bounds are the owner's


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_postgresql_matches_only_rows_already_narrowed_to_the_owners_chats(crowded: TestDatabase) -> None:
    terms = tsquery_terms(parse_search(WORD))
    query = _page_sql(_tsquery_sql([fn for fn, _ in terms]))
    params = {
        **{f"term_{i}": a for i, (_, a) in enumerate(terms)},
        "owner": "alice",
        "limit": 21,
        "offset": 0,
    }
    with crowded.engine().connect() as conn:
        [[plan]] = conn.execute(sql("EXPLAIN (FORMAT JSON) " + query), params).all()
    nodes = list(walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]))
    matching = [n for n in nodes if any("@@" in str(n.get(k, "")) for k in CONDITIONS)]
    assert [n["Node Type"] for n in matching] == ["Subquery Scan"], describe(nodes)
    [messages] = matching[0]["Plans"]  # the match filters what this scan of one chat's messages returns
    assert messages["Relation Name"] == "messages", describe(nodes)
    by_chat = str(messages.get("Index Cond", "")) + str(messages.get("Recheck Cond", ""))
    assert "(session_id)::text = (c" in by_chat, describe(nodes)  # by its index, for the chat at hand
    [loop] = [n for n in nodes if matching[0] in n.get("Plans", [])]  # ... for each chat of the owner
    outer, inner = loop["Plans"]
    assert loop["Node Type"] == "Nested Loop" and inner is matching[0], describe(nodes)
    assert outer["Relation Name"] == "chat_sessions" and "(owner)::text = 'alice'" in json.dumps(outer)
    assert not [n for n in nodes if n.get("Index Name") == "ix_messages_search_vector"], describe(nodes)


CONDITIONS = ("Filter", "Index Cond", "Recheck Cond", "Join Filter", "Hash Cond")


def walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def describe(nodes: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"{n['Node Type']} {n.get('Relation Name', '')} {n.get('Index Name', '')} "
        + " ".join(f"{k}: {n[k]}" for k in CONDITIONS if k in n)
        for n in nodes
    )


# ---- SQLite's owner-keyed index ---------------------------------------------------------------------------------


def keys_are_owner_ranged(db: TestDatabase) -> None:
    """Every message's key is its chat's owner number << 40 | its id, and FTS5's integrity check passes."""
    wrong = db.raw(
        "SELECT m.id FROM messages AS m JOIN chat_sessions AS c ON c.id = m.session_id "
        "JOIN search_owners AS o ON o.owner = c.owner "
        f"WHERE m.search_key IS NOT ((o.num << {KEY_SHIFT}) | m.id)"
    )
    assert wrong == []
    db.raw("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")


async def hits(store: Store, owner: str, text: str) -> list[str]:
    return [hit.session_id for hit in (await store.chats.search_messages(owner, text)).hits]


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_keys_follow_a_chat_to_its_new_owner_and_a_message_to_its_new_chat(
    store: Store, db: TestDatabase
) -> None:
    alice = await store.chats.create_session("alice", title="a")
    await store.chats.add_message(alice.id, "user", "fjords of norway")
    bob = await store.chats.create_session("bob", title="b")
    await store.chats.add_message(bob.id, "user", "glaciers of iceland")
    keys_are_owner_ranged(db)
    assert await hits(store, "alice", "fjords") == [alice.id] and await hits(store, "bob", "fjords") == []

    db.raw("UPDATE chat_sessions SET owner = 'bob' WHERE id = :id", {"id": alice.id})
    keys_are_owner_ranged(db)
    assert await hits(store, "alice", "fjords") == [] and await hits(store, "bob", "fjords") == [alice.id]

    carol = await store.chats.create_session("carol", title="c")
    db.raw(
        "UPDATE messages SET session_id = :to, position = 5 WHERE session_id = :from",
        {"to": carol.id, "from": bob.id},
    )
    keys_are_owner_ranged(db)
    assert await hits(store, "carol", "glaciers") == [carol.id] and await hits(store, "bob", "glaciers") == []
    await store.chats.delete_session("carol", carol.id)
    keys_are_owner_ranged(db)
    assert await hits(store, "carol", "glaciers") == []

"""Full-text search in the store, on SQLite (FTS5) and PostgreSQL (tsvector): the index follows every write, ranks,
scopes to the owner, snippets keep the text as it is, and what a user types never reaches the index's query syntax;
the migration indexes older databases."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine
from sqlalchemy import text as sql
from sqlalchemy.pool import NullPool

from app.db import MATCH_END, MATCH_START, MessageStatus, SearchUnsupported, Store
from app.db.database import alembic_config
from app.db.pg_search import _tsquery_sql
from app.db.search import search_backend
from app.db.search_query import (
    MAX_SEARCH_CHARS,
    SearchQuery,
    SearchTerm,
    fts5_match,
    parse_search,
    tsquery_terms,
)
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio
M0, M1 = MATCH_START, MATCH_END


def assert_index_in_step(db: TestDatabase) -> None:
    """SQLite: FTS5's own check of an external-content index against `messages` (raises 'database disk image is
    malformed' when a row's indexed words differ from its text); valid while no reply streams (those rows are not
    indexed). PostgreSQL: the generated vector is there for every message but the streaming ones."""
    if db.is_sqlite:
        db.raw("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")
        return
    wrong = db.raw("SELECT id, status FROM messages WHERE (search_vector IS NULL) != (status = 'streaming')")
    assert wrong == []


async def chat(store: Store, owner: str, *texts: str, title: str = "t") -> str:
    session = await store.chats.create_session(owner, title=title)
    for i, text in enumerate(texts):
        if i % 2 == 0:
            await store.chats.add_message(session.id, "user", text)
        else:
            await store.chats.add_message(session.id, "assistant", text, status=MessageStatus.FINISHED)
    return session.id


async def found(store: Store, owner: str, text: str, **page: int) -> list[tuple[str, str]]:
    """(session id, snippet) of each hit, best first."""
    result = await store.chats.search_messages(owner, text, **page)
    return [(hit.session_id, hit.snippet) for hit in result.hits]


async def test_index_follows_insert_stream_edit_and_delete(store: Store, db: TestDatabase) -> None:
    sid = await chat(store, "alice", "How do I boil an egg?")
    assert await found(store, "alice", "boil") == [(sid, f"How do I {M0}boil{M1} an egg?")]

    reply = await store.chats.start_assistant(
        sid, prompt_tokens=5, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="f"
    )
    await store.chats.flush_assistant(reply.id, "Put it in simmering")
    assert await found(store, "alice", "simmering") == []  # a streaming reply is indexed once it ends
    await store.chats.finish_assistant(
        reply.id,
        content="Put it in gently bubbling water",
        status="finished",
        finish_reason="stop",
        token_ids=[1, 2],
        completion_tokens=2,
        timings={},
    )
    assert await found(store, "alice", "simmering") == []
    assert await found(store, "alice", "bubbling") == [(sid, f"Put it in gently {M0}bubbling{M1} water")]
    assert_index_in_step(db)

    streaming = await store.chats.start_assistant(
        sid, prompt_tokens=9, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="f"
    )
    await store.chats.flush_assistant(streaming.id, "half a sentence about bubbling")
    await store.chats.delete_messages_from(sid, streaming.id)  # regenerate while streaming: nothing to forget
    assert [s for s, _ in await found(store, "alice", "bubbling")] == [sid]
    assert_index_in_step(db)

    # an edit is a new version beside the first (a branch): both stay in the chat, and in the index
    await store.chats.add_message(sid, "user", "How do I poach an egg?", parent_id=None)
    assert await found(store, "alice", "poach") == [(sid, f"How do I {M0}poach{M1} an egg?")]
    assert [s for s, _ in await found(store, "alice", "boil")] == [sid]
    assert_index_in_step(db)

    # continue: the reply streams again (out of the index) and is indexed with its longer text when it ends
    await store.chats.resume_assistant(
        reply.id, prompt_tokens=7, cached_tokens=5, truncated_turns=0, tokenizer_fingerprint="f"
    )
    assert await found(store, "alice", "bubbling") == []
    await store.chats.finish_assistant(
        reply.id,
        content="Put it in gently bubbling water for nine minutes",
        status="finished",
        finish_reason="stop",
        token_ids=[1, 2, 3],
        completion_tokens=3,
        timings={},
    )
    assert [s for s, _ in await found(store, "alice", "minutes")] == [sid]
    assert_index_in_step(db)

    other = await chat(store, "alice", "poach pears in wine")
    assert await store.chats.delete_session("alice", sid)  # the cascade's deletions fire the trigger too
    assert [s for s, _ in await found(store, "alice", "poach")] == [other]
    if db.is_sqlite:
        left = db.raw("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'egg OR minutes'")
    else:
        left = db.raw(
            "SELECT count(*) FROM messages WHERE search_vector @@ to_tsquery('pagedchat_search', 'egg | minutes')"
        )
    assert left == [(0,)]
    assert_index_in_step(db)


async def test_another_owner_never_sees_a_chat(store: Store) -> None:
    mine = await chat(store, "alice", "the secret recipe for lefse")
    theirs = await chat(store, "bob", "my own lefse recipe")
    assert [s for s, _ in await found(store, "alice", "lefse")] == [mine]
    assert [s for s, _ in await found(store, "bob", "lefse")] == [theirs]
    assert await found(store, "mallory", "lefse") == []


async def test_chats_rank_by_bm25_and_show_their_best_message(store: Store) -> None:
    once = await chat(store, "alice", "a long note that names kayak once among many other words about rivers")
    often = await chat(store, "alice", "kayak kayak kayak", "unrelated", "a kayak trip")
    page = await store.chats.search_messages("alice", "kayak")
    assert [hit.session_id for hit in page.hits] == [often, once]  # more hits in less text ranks higher
    best = page.hits[0]
    assert (best.position, best.role, best.num_matches) == (0, "user", 2)
    assert best.snippet == f"{M0}kayak{M1} {M0}kayak{M1} {M0}kayak{M1}"
    assert (page.hits[1].num_matches, page.next_offset) == (1, None)


async def test_words_phrases_prefixes_stems_and_accents(store: Store) -> None:
    sid = await chat(store, "alice", "Running scripts in Python and Rust at the café near Oslo")
    for text in ["python oslo", "pyth", "runs", "RUNNING", "cafe", '"rust at the"', "NEAR(", "AND python"]:
        assert [s for s, _ in await found(store, "alice", text)] == [sid], text
    for text in ["pyth ", '"oslo python"', "python paris", "script_kiddie", "python OR paris", "NOT rust"]:
        # a prefix only while typing; phrases keep their order; operators are words to look for
        assert await found(store, "alice", text) == [], text


async def test_snippets_keep_html_as_text(store: Store) -> None:
    await chat(store, "alice", 'Use <script>alert("x")</script> and <b>bold</b> needle &amp; more')
    [(_, snippet)] = await found(store, "alice", "needle")
    assert snippet == f'Use <script>alert("x")</script> and <b>bold</b> {M0}needle{M1} &amp; more'


LONG = (
    "a long note that names many other words about rivers and then some more words to go past the limit of "
    "sixteen words surely kayak and more kayak after that, and yet more words follow here to the end."
)
CODE = "See example.com or /usr/lib/x.so, e-mail a@b.com, <div>code</div> and snake_case kayak don't"


async def test_punctuation_separates_words_and_snippets_are_windows_around_the_matches(store: Store) -> None:
    # the same words and the same snippets on both databases (FTS5's snippet() made these)
    long, code = await chat(store, "alice", LONG), await chat(store, "alice", CODE)
    assert dict(await found(store, "alice", "kayak")) == {
        long: f"…the limit of sixteen words surely {M0}kayak{M1} and more {M0}kayak{M1} after that, and yet more words…",
        code: f"…x.so, e-mail a@b.com, <div>code</div> and snake_case {M0}kayak{M1} don't",
    }
    assert await found(store, "alice", "example") == [
        (code, f"See {M0}example{M1}.com or /usr/lib/x.so, e-mail a@b.com, <div>code</div…")
    ]
    assert await found(store, "alice", "div") == [
        (code, f"See example.com or /usr/lib/x.so, e-mail a@b.com, <{M0}div{M1}>code</{M0}div{M1}…")
    ]
    assert await found(store, "alice", "snake case") == [
        (code, f"…x.so, e-mail a@b.com, <div>code</div> and {M0}snake{M1}_{M0}case{M1} kayak don't")
    ]
    assert await found(store, "alice", "mail") == [
        (code, f"See example.com or /usr/lib/x.so, e-{M0}mail{M1} a@b.com, <div>code</div…")
    ]


async def test_pages_cover_every_chat_once(store: Store) -> None:
    ids = {await chat(store, "alice", f"walrus number {i}") for i in range(5)}
    seen, offset, pages = [], 0, 0
    while offset is not None:
        page = await store.chats.search_messages("alice", "walrus", limit=2, offset=offset)
        seen += [hit.session_id for hit in page.hits]
        offset, pages = page.next_offset, pages + 1
    assert (sorted(seen), pages) == (sorted(ids), 3)


# checked before any database is asked: SQLite stands for both
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "holds no word to look for"),
        ('"', "holds no word to look for"),
        ("*", "holds no word to look for"),
        ("( ) - ^ :", "holds no word to look for"),
        ("x" * (MAX_SEARCH_CHARS + 1), f"over the limit of {MAX_SEARCH_CHARS}"),
        (" ".join("w" * 17), "17 words or phrases, over the limit of 16"),
    ],
)
async def test_searches_without_words_or_past_limits_are_value_errors(
    store: Store, text: str, fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        await store.chats.search_messages("alice", text)


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("page", "fragment"), [({"limit": 0}, "limit"), ({"limit": 51}, "limit"), ({"offset": -1}, "offset")]
)
async def test_page_limits_are_value_errors(store: Store, page: dict[str, int], fragment: str) -> None:
    with pytest.raises(ValueError, match=f"{fragment} must be between"):
        await store.chats.search_messages("alice", "word", **page)


def test_parsed_terms_and_their_fts5_form() -> None:
    query = parse_search('say "hello,  World" AND foo.bar NEAR( "x')
    assert query == SearchQuery(
        (
            SearchTerm(("say",)),
            SearchTerm(("hello", "World")),
            SearchTerm(("AND",)),
            SearchTerm(("foo",)),
            SearchTerm(("bar",)),
            SearchTerm(("NEAR",)),
            SearchTerm(("x",), prefix=True),
        )
    )
    assert fts5_match(query) == '"say" "hello World" "AND" "foo" "bar" "NEAR" "x"*'


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_any_typed_text_is_a_valid_fts5_query_or_a_value_error(text: str) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE VIRTUAL TABLE t USING fts5(content, tokenize='porter unicode61 remove_diacritics 2')"
    )
    conn.execute("INSERT INTO t VALUES ('near and or not * \" text')")
    try:
        match = fts5_match(parse_search(text))
    except ValueError as exc:
        assert "no word" in str(exc) or "over the limit" in str(exc)
        return
    conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (match,)).fetchall()  # raises on a syntax error


@pytest.fixture(scope="module")
def pg_search_engine(postgres, postgres_template) -> Iterator[Engine]:
    """An engine on a database at head of the session's PostgreSQL server, for the module's synchronous tests."""
    name = postgres.create_database(postgres_template)
    engine = create_engine(postgres.url(name), poolclass=NullPool)
    yield engine
    engine.dispose()
    postgres.drop_database(name)


def test_parsed_terms_and_their_tsquery_form() -> None:
    query = parse_search('say "hello,  World" AND it\'s x')
    assert tsquery_terms(query) == [
        ("phraseto_tsquery", "say"),
        ("phraseto_tsquery", "hello World"),
        ("phraseto_tsquery", "AND"),
        ("phraseto_tsquery", "it"),
        ("phraseto_tsquery", "s"),
        ("to_tsquery", "'x':*"),
    ]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_any_typed_text_is_a_valid_tsquery_or_a_value_error(pg_search_engine: Engine, text_: str) -> None:
    try:
        terms = tsquery_terms(parse_search(text_))
    except ValueError as exc:
        assert "no word" in str(exc) or "over the limit" in str(exc)
        return
    query = sql(
        "SELECT count(*) FROM (VALUES (to_tsvector('pagedchat_search', 'near and or not * \" & | ! <-> :* text'))) "
        f"AS t(v) WHERE v @@ ({_tsquery_sql([fn for fn, _ in terms])})"
    )
    with pg_search_engine.connect() as conn:  # raises on a syntax error
        conn.execute(query, {f"term_{i}": argument for i, (_, argument) in enumerate(terms)}).scalar_one()


def test_other_databases_say_search_is_not_supported() -> None:
    with pytest.raises(SearchUnsupported, match=r"not supported on this database \(mysql\)"):
        search_backend("mysql")


async def test_0006_indexes_the_messages_of_an_older_database(empty_db: TestDatabase) -> None:
    db = empty_db
    cfg = alembic_config(db.url)
    command.upgrade(cfg, "0002")
    now = "2026-01-01 00:00:00"
    session = "INSERT INTO chat_sessions VALUES (:id, :owner, :title, '', '{}', :now, :now)"
    db.raw(session, {"id": "s1", "owner": "alice", "title": "Fjords", "now": now})
    db.raw(session, {"id": "s2", "owner": "bob", "title": "Mine", "now": now})
    insert = (
        "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
        "VALUES (:sid, :position, :role, :content, :status, :now, :now)"
    )
    for sid, position, role, content, status in [
        ("s1", 0, "user", "Which fjord is deepest?", "complete"),
        ("s1", 1, "assistant", "Sognefjord, 1308 m deep.", "finished"),
        ("s2", 0, "user", "fjord cruise prices", "complete"),
        ("s1", 2, "assistant", "cut off mid glacier", "streaming"),
    ]:
        db.raw(insert, dict(sid=sid, position=position, role=role, content=content, status=status, now=now))
    store = Store(db.url)
    await store.start()  # migrates to head, then marks the reply left streaming 'interrupted': indexed then
    try:
        assert [h.position for h in (await store.chats.search_messages("alice", "glacier")).hits] == [2]
        page = await store.chats.search_messages("alice", "fjord")
        assert [(h.session_id, h.title, h.num_matches, h.snippet) for h in page.hits] == [
            ("s1", "Fjords", 1, f"Which {M0}fjord{M1} is deepest?")
        ]
        numbers = await store.chats.search_messages("alice", "sognefjord 1308")
        assert [h.session_id for h in numbers.hits] == ["s1"]
        # the triggers run on the migrated table
        await store.chats.add_message("s1", "user", "And the longest fjord?")
        assert (await store.chats.search_messages("alice", "longest")).hits[0].position == 3
    finally:
        await store.close()
    assert_index_in_step(db)
    command.downgrade(cfg, "0002")
    if db.is_sqlite:
        names = {name for (name,) in db.raw("SELECT name FROM sqlite_master")}
        assert not {n for n in names if n.startswith("messages_fts")}
    else:
        assert "search_vector" not in db.columns("messages")
        assert db.raw("SELECT cfgname FROM pg_ts_config WHERE cfgname LIKE 'pagedchat%'") == []
        assert db.raw("SELECT dictname FROM pg_ts_dict WHERE dictname LIKE 'pagedchat%'") == []
    assert db.raw("SELECT count(*) FROM messages") == [(5,)]  # the messages stay

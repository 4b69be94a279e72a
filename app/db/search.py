"""Full-text search over an owner's messages, behind one small interface per database.

SQLite: an FTS5 table over `messages.content` (external content: the index holds no second copy of the text), kept in
step by triggers on insert, update and delete of messages, deletions through the session cascade included; a reply
enters it when it stops streaming (migration 0006 creates it and indexes the messages already there). Its rowids put
each owner's messages in a range of their own (migration 0008: `messages.search_key`, owner number << 40 | message
id), and a search asks FTS5 for that range only: the time it takes follows the owner's own matches, not how common
a word is in other users' chats. PostgreSQL: a generated tsvector column, read for the owner's messages only
(app/db/pg_search.py). Other databases have no implementation: searching there raises SearchUnsupported.

A hit is a chat: its best-ranked matching message (bm25; PostgreSQL: ts_rank), that message's snippet and how many of
its messages match. Snippets are the message's own text, with MATCH_START / MATCH_END (control characters U+0002 /
U+0003) around each matched word: a page escapes the text and turns only those markers into highlighting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import DateTime, Integer, String, bindparam, text
from sqlalchemy.orm import Session

from app.db import pg_search
from app.db.search_hits import MATCH_END, MATCH_START, SNIPPET_TOKENS, SearchPage, search_page
from app.db.search_query import SearchQuery, fts5_match, parse_search

SEARCH_INDEX = "messages_fts"  # the FTS5 table; SQLite keeps its data in shadow tables messages_fts_*
SEARCH_OWNERS = "search_owners"  # SQLite: owner -> the number that leads its messages' search keys
SEARCH_KEY = "search_key"  # SQLite: messages' column, the index's rowid
SEARCH_KEY_INDEX = "ix_messages_search_key"
KEY_SHIFT = 40  # search_key = owner number << KEY_SHIFT | message id (migration 0008)
MAX_SEARCH_LIMIT = 50
MAX_SEARCH_OFFSET = 10_000


class SearchUnsupported(Exception):
    """This database has no full-text search implementation."""


class MessageSearch(Protocol):
    """A database's full-text search over the messages of one owner's chats."""

    def search(self, s: Session, owner: str, query: SearchQuery, limit: int, offset: int) -> SearchPage:
        """Up to `limit` chats of `owner` matching every term of `query`, best first, from `offset` on."""
        ...


def is_search_index_table(name: str) -> bool:
    """Whether a table is the search index, one of its shadow tables or its owner numbers (Alembic compares models
    without them)."""
    return name in (SEARCH_INDEX, SEARCH_OWNERS) or name.startswith(SEARCH_INDEX + "_")


def is_search_index_column(name: str) -> bool:
    """Whether a column or index of messages is the search index's (PostgreSQL's vector, SQLite's key; Alembic
    compares models without them)."""
    return name in (pg_search.COLUMN, pg_search.INDEX, SEARCH_KEY, SEARCH_KEY_INDEX)


def search_backend(dialect_name: str) -> MessageSearch:
    """The implementation for a database dialect; SearchUnsupported where there is none."""
    if dialect_name == "sqlite":
        return Fts5Search()
    if dialect_name == "postgresql":
        return pg_search.TsvectorSearch()
    raise SearchUnsupported(
        f"searching chats is not supported on this database ({dialect_name}): SQLite's FTS5 and PostgreSQL's "
        "tsvector are the implemented ones"
    )


def search_messages(s: Session, owner: str, text_: str, /, *, limit: int = 20, offset: int = 0) -> SearchPage:
    """The owner's chats whose messages match what the user typed (words, "phrases", the last word as a prefix),
    best first; ValueError for a search with no words or past its limits, SearchUnsupported on a database without
    an implementation."""
    if not 1 <= limit <= MAX_SEARCH_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_SEARCH_LIMIT}, got {limit}")
    if not 0 <= offset <= MAX_SEARCH_OFFSET:
        raise ValueError(f"offset must be between 0 and {MAX_SEARCH_OFFSET}, got {offset}")
    query = parse_search(text_)
    return search_backend(s.get_bind().dialect.name).search(s, owner, query, limit, offset)


# The owner's range of index rowids: the scalar subqueries are constants to FTS5, which seeks each word's doclist
# to the range's start and stops at its end (EXPLAIN QUERY PLAN: "VIRTUAL TABLE INDEX 0:M1><", the match and both
# rowid bounds). An owner with no chat yet has no number: NULL bounds, no rows.
_OWNER_RANGE = f"""
    {SEARCH_INDEX}.rowid BETWEEN (SELECT num << {KEY_SHIFT} FROM {SEARCH_OWNERS} WHERE owner = :owner)
        AND (SELECT (num << {KEY_SHIFT}) | {(1 << KEY_SHIFT) - 1} FROM {SEARCH_OWNERS} WHERE owner = :owner)
"""
# The best message of each matching chat of the owner, ranked: FTS5's bm25 (lower is better), then the newest chat.
_FTS5_PAGE = text(
    f"""
    WITH hits AS (
        SELECT m.session_id, m.id AS message_id, m.position, m.role, bm25({SEARCH_INDEX}) AS rank
        FROM {SEARCH_INDEX}
        JOIN messages AS m ON m.{SEARCH_KEY} = {SEARCH_INDEX}.rowid
        JOIN chat_sessions AS c ON c.id = m.session_id
        WHERE {SEARCH_INDEX} MATCH :match AND {_OWNER_RANGE} AND c.owner = :owner
    ), best AS (
        SELECT hits.*,
            row_number() OVER (PARTITION BY session_id ORDER BY rank, position) AS nth,
            count(*) OVER (PARTITION BY session_id) AS num_matches
        FROM hits
    )
    SELECT best.session_id, c.title, c.updated_at, best.message_id, best.position, best.role, best.num_matches
    FROM best JOIN chat_sessions AS c ON c.id = best.session_id
    WHERE best.nth = 1
    ORDER BY best.rank, c.updated_at DESC, best.session_id
    LIMIT :limit OFFSET :offset
    """
).columns(
    session_id=String,
    title=String,
    updated_at=DateTime(timezone=True),
    message_id=Integer,
    position=Integer,
    role=String,
    num_matches=Integer,
)

# Snippets of the page's messages only (snippet() tokenizes the message's text again: not for every match).
_FTS5_SNIPPETS = text(
    f"""
    SELECT m.id, snippet({SEARCH_INDEX}, 0, :start, :end, '…', :num_tokens)
    FROM {SEARCH_INDEX} JOIN messages AS m ON m.{SEARCH_KEY} = {SEARCH_INDEX}.rowid
    WHERE {SEARCH_INDEX} MATCH :match AND {SEARCH_INDEX}.rowid IN (SELECT {SEARCH_KEY} FROM messages WHERE id IN :ids)
    """
).bindparams(bindparam("ids", expanding=True))


class Fts5Search:
    """SQLite FTS5 (migration 0006's `messages_fts`, keyed by owner since 0008)."""

    def search(self, s: Session, owner: str, query: SearchQuery, limit: int, offset: int) -> SearchPage:
        """See MessageSearch.search."""
        match = fts5_match(query)
        params = {"match": match, "owner": owner, "limit": limit + 1, "offset": offset}
        rows = s.execute(_FTS5_PAGE, params).all()

        def snippets_of(page: Sequence[Any]) -> dict[int, str]:
            snippet_params = {
                "match": match,
                "ids": [row.message_id for row in page],
                "start": MATCH_START,
                "end": MATCH_END,
                "num_tokens": SNIPPET_TOKENS,
            }
            return {row[0]: row[1] for row in s.execute(_FTS5_SNIPPETS, snippet_params)}

        return search_page(rows, limit, offset, snippets_of)

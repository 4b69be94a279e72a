"""PostgreSQL's full-text search over messages: migration 0006's `messages.search_vector` (a generated tsvector, NULL
while a reply streams) in the text search configuration `pagedchat_search` (English stems, case and accents folded,
no stop words dropped), matched against the owner's own messages only: the owner's chats by their index, each chat's
messages by theirs, then the match. A GIN index over everyone's vectors made a search as slow as its word was common
in other users' chats (a timing side channel: 13 ms against 1 ms with 20,000 of them), so migration 0008 drops it.

What the user typed reaches the database only as the text arguments of phraseto_tsquery and a quoted prefix lexeme
(app/db/search_query.py). Ranking is ts_rank normalised by the message's length (more hits in less text ranks
higher, as bm25 has it). Snippets are made here (app/db/snippets.py) from the words PostgreSQL says match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import DateTime, Integer, String, bindparam, text
from sqlalchemy.orm import Session

from app.db.search_hits import MATCH_END, MATCH_START, SNIPPET_TOKENS, SearchPage, search_page
from app.db.search_query import SearchQuery, tsquery_terms
from app.db.snippets import candidate_words, make_snippet

CONFIG = "pagedchat_search"  # migration 0006 creates it, and the column below
COLUMN = "search_vector"
INDEX = "ix_messages_search_vector"  # 0006's GIN index, which 0008 drops
_RANK_NORMALIZATION = 1  # divide by 1 + log(the message's length in words)


def _tsquery_sql(functions: list[str]) -> str:
    """`fn_0(config, :term_0) && fn_1(config, :term_1) && ...`: the functions are ours, the texts parameters."""
    assert all(fn in ("phraseto_tsquery", "to_tsquery") for fn in functions), functions
    return " && ".join(f"{fn}('{CONFIG}'::regconfig, :term_{i})" for i, fn in enumerate(functions))


def _page_sql(query_sql: str) -> str:
    # the best message of each matching chat of the owner, ranked (higher is better), then the newest chat. The
    # owner's chats come first, each one's messages by its index; OFFSET 0 keeps the planner from folding that
    # subquery into the join and from moving the match into it, so no plan starts from the word or reads other
    # owners' messages
    return f"""
    WITH q AS (SELECT {query_sql} AS query),
    hits AS (
        SELECT m.session_id, m.id AS message_id, m.position, m.role,
            ts_rank(m.{COLUMN}, q.query, {_RANK_NORMALIZATION}) AS rank
        FROM q, chat_sessions AS c
        CROSS JOIN LATERAL (
            SELECT id, session_id, position, role, {COLUMN} FROM messages WHERE session_id = c.id OFFSET 0
        ) AS m
        WHERE c.owner = :owner AND m.{COLUMN} @@ q.query
    ), best AS (
        SELECT hits.*,
            row_number() OVER (PARTITION BY session_id ORDER BY rank DESC, position) AS nth,
            count(*) OVER (PARTITION BY session_id) AS num_matches
        FROM hits
    )
    SELECT best.session_id, c.title, c.updated_at, best.message_id, best.position, best.role, best.num_matches
    FROM best JOIN chat_sessions AS c ON c.id = best.session_id
    WHERE best.nth = 1
    ORDER BY best.rank DESC, c.updated_at DESC, best.session_id
    LIMIT :limit OFFSET :offset
    """


_PAGE_COLUMNS = dict(
    session_id=String,
    title=String,
    updated_at=DateTime(timezone=True),
    message_id=Integer,
    position=Integer,
    role=String,
    num_matches=Integer,
)
_CUSTOM_PLANS = text("SET LOCAL plan_cache_mode = force_custom_plan")  # this transaction only
_CONTENTS = text("SELECT id, content FROM messages WHERE id IN :ids").bindparams(
    bindparam("ids", expanding=True)
)
_LEXEMES = text(
    f"SELECT w, tsvector_to_array(to_tsvector('{CONFIG}'::regconfig, w)) FROM unnest(CAST(:words AS text[])) AS w"
)


class TsvectorSearch:
    """PostgreSQL tsvector over the owner's messages (migration 0006's `messages.search_vector`)."""

    def search(self, s: Session, owner: str, query: SearchQuery, limit: int, offset: int) -> SearchPage:
        """See app/db/search.py's MessageSearch.search."""
        # planned for this owner's number of chats: a generic plan, which psycopg's prepared statements get after a
        # few runs, would take another owner's
        s.execute(_CUSTOM_PLANS)
        terms = tsquery_terms(query)
        page = text(_page_sql(_tsquery_sql([fn for fn, _ in terms]))).columns(**_PAGE_COLUMNS)
        params = {f"term_{i}": argument for i, (_, argument) in enumerate(terms)}
        rows = s.execute(page, {**params, "owner": owner, "limit": limit + 1, "offset": offset}).all()

        def snippets_of(page_rows: Sequence[Any]) -> dict[int, str]:
            contents = dict(s.execute(_CONTENTS, {"ids": [row.message_id for row in page_rows]}).all())
            is_match = _matcher(s, query, contents.values())
            return {
                message_id: make_snippet(content, is_match, SNIPPET_TOKENS, MATCH_START, MATCH_END)
                for message_id, content in contents.items()
            }

        return search_page(rows, limit, offset, snippets_of)


def _matcher(s: Session, query: SearchQuery, texts: Iterable[str]) -> Callable[[str], bool]:
    """Whether a word of `texts` matches a word of `query`: their lexemes in the search configuration are equal
    (a prefix term: the word's lexeme starts with the prefix's). One round trip for the words that may match."""
    query_words = [w for term in query.terms for w in term.words]
    candidates = candidate_words(texts, query_words)
    lexemes = dict(s.execute(_LEXEMES, {"words": sorted(candidates | set(query_words))}).all())
    exact: set[str] = set()
    prefixes: list[str] = []
    for term in query.terms:
        for word in term.words:
            if term.prefix:
                prefixes += lexemes[word]
            else:
                exact.update(lexemes[word])

    def is_match(word: str) -> bool:
        found = lexemes.get(word, ())
        return any(lexeme in exact or lexeme.startswith(tuple(prefixes)) for lexeme in found)

    return is_match

"""What a search finds, whichever database answers it: hits (one per chat) and pages of them, with snippets marked
by MATCH_START / MATCH_END (control characters U+0002 / U+0003 around each matched word)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db.records import as_utc

MATCH_START = "\x02"
MATCH_END = "\x03"
SNIPPET_TOKENS = 16  # words of a snippet


@dataclass(frozen=True)
class SearchHit:
    """One chat that matches: its best message (by rank), a snippet of it, and how many of its messages match."""

    session_id: str
    title: str
    updated_at: datetime
    message_id: int
    position: int
    role: str
    snippet: str
    num_matches: int


@dataclass(frozen=True)
class SearchPage:
    """Hits, best first; `next_offset` is where the next page starts, None after the last."""

    hits: tuple[SearchHit, ...]
    next_offset: int | None


def search_page(
    rows: Sequence[Any], limit: int, offset: int, snippets_of: Callable[[Sequence[Any]], Mapping[int, str]]
) -> SearchPage:
    """A page of hits from a search's rows, asked for one more than `limit` (to tell whether a next page exists),
    each with session_id, title, updated_at, message_id, position, role and num_matches; `snippets_of(page_rows)`
    gives their snippets by message id (not called for an empty page)."""
    page = rows[:limit]
    snippets = snippets_of(page) if page else {}
    hits = tuple(
        SearchHit(
            session_id=row.session_id,
            title=row.title,
            updated_at=as_utc(row.updated_at),
            message_id=row.message_id,
            position=row.position,
            role=row.role,
            snippet=snippets[row.message_id],
            num_matches=row.num_matches,
        )
        for row in page
    )
    return SearchPage(hits, offset + limit if len(rows) > limit else None)

"""What a search finds, whichever database answers it: hits (one per chat) and pages of them, with snippets marked
by MATCH_START / MATCH_END (control characters U+0002 / U+0003 around each matched word)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

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

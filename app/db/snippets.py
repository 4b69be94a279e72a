"""Snippets made outside the database: a window of a message's words with the matched ones marked, as SQLite's FTS5
`snippet()` makes them (PostgreSQL's ts_headline would drop anything that looks like an HTML tag from the text).

The caller says which words match (PostgreSQL tells it, from the words' lexemes); the snippet is the message's own
text from the window's first word to its last, with MATCH_START / MATCH_END around each matched word and `…` where
the window cuts the text.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_left
from collections.abc import Callable, Iterable

from app.db.search_query import WORD

ELLIPSIS = "…"


def fold(word: str) -> str:
    """Case and accents folded (NFKD without its combining marks): how a word's first letter is compared."""
    decomposed = unicodedata.normalize("NFKD", word.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def may_match(word: str, initials: set[str]) -> bool:
    """Whether `word` could stem to a lexeme of the query: stemming and accent folding keep an ASCII first letter
    (they change endings and accents), so only words starting with a query word's first letter, or with a letter
    folding may change (non-ASCII), need asking the database."""
    first = fold(word)[:1]
    return first in initials or not first.isascii()


def candidate_words(texts: Iterable[str], query_words: Iterable[str]) -> set[str]:
    """The distinct words of `texts` that may match a query made of `query_words` (see may_match)."""
    initials = {fold(w)[:1] for w in query_words}
    return {w for text in texts for w in WORD.findall(text) if may_match(w, initials)}


def sentence_starts(text: str, spans: list[tuple[int, int]]) -> list[int]:
    """The words that begin a sentence as FTS5 sees it: the first word, and each word after '.' or ':' and white
    space ("example.com" holds no sentence start)."""
    starts = [0]
    for i, (a, _) in enumerate(spans[1:], start=1):
        before = text[:a]
        stripped = before.rstrip(" \t\n\r")
        if len(stripped) < len(before) and stripped[-1:] in (".", ":"):
            starts.append(i)
    return starts


def make_snippet(
    text: str, is_match: Callable[[str], bool], num_words: int, start_mark: str, end_mark: str
) -> str:
    """A window of `num_words` words of `text`, chosen as FTS5's snippet() chooses it: of the windows starting at a
    matched word (moved so that their matches sit in the middle) and at the sentence start before it (a bonus of
    120 at the text's start, 100 elsewhere), the one whose matched words score most: 1000 a distinct word, 1 a
    repeat; the earliest of equals. The matched words are put between the marks."""
    spans = [(m.start(), m.end()) for m in WORD.finditer(text)]
    if not spans:
        return text
    keys = [fold(text[a:b]) if is_match(text[a:b]) else None for a, b in spans]
    hits = [i for i, key in enumerate(keys) if key is not None]
    num_words = min(num_words, len(spans))

    def score(start: int) -> tuple[int, list[int]]:
        inside = hits[bisect_left(hits, start) : bisect_left(hits, start + num_words)]
        distinct = len({keys[i] for i in inside})
        return 1000 * distinct + len(inside) - distinct, inside

    first, best = 0, -1
    starts = sentence_starts(text, spans) if len(spans) > num_words else []
    for hit in hits:
        points, inside = score(hit)
        if points > best:
            centred = inside[0] - (num_words - (inside[-1] - inside[0])) // 2
            best, first = points, max(0, min(centred, len(spans) - num_words))
        n = bisect_left(starts, hit)  # the sentence starts before this hit
        if n:
            points = score(starts[n - 1])[0] + (120 if starts[n - 1] == 0 else 100)
            if points > best:
                best, first = points, starts[n - 1]
    last = min(first + num_words, len(spans)) - 1
    begin = 0 if first == 0 else spans[first][0]
    end = len(text) if last == len(spans) - 1 else spans[last][1]
    parts = [ELLIPSIS] if first > 0 else []
    cursor = begin
    for i in range(first, last + 1):
        if keys[i] is not None:
            a, b = spans[i]
            parts += [text[cursor:a], start_mark, text[a:b], end_mark]
            cursor = b
    parts.append(text[cursor:end])
    if end < len(text):
        parts.append(ELLIPSIS)
    return "".join(parts)

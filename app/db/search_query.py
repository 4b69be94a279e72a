"""What a user typed into the search box, as terms a full-text index can take safely.

The text is never handed to the index's own query language (FTS5 reads `"`, `*`, `AND`, `NEAR(`, `col:`; tsquery
reads `&`, `|`, `!`, `:*`): it is cut into words (Unicode letters and digits, as SQLite's unicode61 tokenizer and
PostgreSQL's parser cut them), a "double-quoted" run of words is kept as a phrase, and the last word is matched as a
prefix while the user is still typing it. Each backend then writes these terms in its own syntax, quoting every word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_SEARCH_CHARS = 200
MAX_TERMS = 16

# a "quoted run" (closed), or a run of anything else up to a space or a quote; a lone quote matches neither
_CHUNK = re.compile(r'"([^"]*)"|[^\s"]+')
WORD = re.compile(r"[^\W_]+")  # letters and digits: "_" and punctuation separate words, as the tokenizers do


@dataclass(frozen=True)
class SearchTerm:
    """Words that must appear in this order (one word: anywhere); `prefix`: the last word may go on."""

    words: tuple[str, ...]
    prefix: bool = False


@dataclass(frozen=True)
class SearchQuery:
    """Every term must match (AND)."""

    terms: tuple[SearchTerm, ...]


def parse_search(text: str) -> SearchQuery:
    """The terms of `text`; ValueError when it is too long or holds no word to look for."""
    if not isinstance(text, str):
        raise ValueError(f"the search must be a string, got {type(text).__name__}")
    if len(text) > MAX_SEARCH_CHARS:
        raise ValueError(f"the search is {len(text)} characters long, over the limit of {MAX_SEARCH_CHARS}")
    terms: list[SearchTerm] = []
    for chunk in _CHUNK.finditer(text):
        quoted = chunk.group(1) is not None
        words = tuple(WORD.findall(chunk.group(1) if quoted else chunk.group(0)))  # the index folds case
        if not words:
            continue
        if quoted:
            terms.append(SearchTerm(words))
        else:  # foo.bar, don't: one word each, as the index splits them
            terms.extend(SearchTerm((w,)) for w in words)
    if not terms:
        raise ValueError(f"the search {text[:60]!r} holds no word to look for (letters or digits)")
    if len(terms) > MAX_TERMS:
        raise ValueError(f"the search holds {len(terms)} words or phrases, over the limit of {MAX_TERMS}")
    last = terms[-1]
    still_typing = len(last.words) == 1 and WORD.fullmatch(text[-1]) is not None
    if still_typing:
        terms[-1] = SearchTerm(last.words, prefix=True)
    return SearchQuery(tuple(terms))


def fts5_match(query: SearchQuery) -> str:
    """The query as an FTS5 MATCH expression: every word inside double quotes (words hold only letters and
    digits, so no quote or operator can get in), terms side by side (AND), a prefix term with `*`."""
    parts = []
    for term in query.terms:
        phrase = '"' + " ".join(term.words) + '"'
        parts.append(phrase + "*" if term.prefix else phrase)
    return " ".join(parts)


def tsquery_terms(query: SearchQuery) -> list[tuple[str, str]]:
    """The query as PostgreSQL tsquery pieces to AND together: (function, its text argument) per term.

    Words and phrases go to phraseto_tsquery, which reads its text as plain words (no operator syntax); a prefix
    term goes to to_tsquery as one quoted lexeme with `:*`: its word holds only letters and digits, and quotes and
    backslashes would be escaped anyway, so nothing a user typed is read as an operator.
    """
    terms = []
    for term in query.terms:
        if term.prefix:
            (word,) = term.words
            quoted = word.replace("\\", "\\\\").replace("'", "''")
            terms.append(("to_tsquery", f"'{quoted}':*"))
        else:
            terms.append(("phraseto_tsquery", " ".join(term.words)))
    return terms

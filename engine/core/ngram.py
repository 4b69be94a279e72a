"""Prompt-lookup proposals (vLLM's `ngram` speculative method): the tokens that followed the latest earlier occurrence
of the sequence's own last n tokens, in its prompt or its output, for the longest n in [min_n, max_n] that has one.

Chat repeats what came before (code the user pasted and wants changed, a document being quoted, an answer being
revised), and there the continuation of an earlier match is often the continuation now. `NgramIndex` keeps, as the
sequence grows, each n-gram's latest end position, so a proposal costs O(max_n) a token instead of a scan of the
whole context. Pure Python: the scheduler's side of speculation (issue #40) and `pagedchat bench speculative
--replay-k`, which replays greedy outputs through it to measure how many proposed tokens the model would accept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Proposal:
    """Up to k tokens proposed to follow the sequence, from its earlier text at `source` (the position of the first
    proposed token; -1 when there is no proposal), matched on the last `ngram` tokens (0: none)."""

    token_ids: tuple[int, ...]
    source: int
    ngram: int


NO_PROPOSAL = Proposal((), -1, 0)


class NgramIndex:
    """A growing token sequence and, for each n in [min_n, max_n], where its current last n tokens occurred before."""

    def __init__(self, min_n: int, max_n: int, token_ids: Iterable[int] = ()) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got min {min_n}, max {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._latest: dict[
            tuple[int, ...], int
        ] = {}  # n-gram -> the position just past its latest occurrence
        self._previous: dict[
            int, int
        ] = {}  # n -> past the occurrence of the last n tokens before the current one
        self.extend(token_ids)

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token_id: int) -> None:
        tokens = self.tokens
        tokens.append(token_id)
        end = len(tokens)
        for n in range(self.min_n, min(self.max_n, end) + 1):
            key = tuple(tokens[end - n :])
            earlier = self._latest.get(key)
            if earlier is None:
                self._previous.pop(n, None)
            else:
                self._previous[n] = earlier
            self._latest[key] = end

    def extend(self, token_ids: Iterable[int]) -> None:
        for token_id in token_ids:
            self.append(token_id)

    def propose(self, k: int) -> Proposal:
        """Up to k tokens following the latest earlier occurrence of the longest matching suffix n-gram."""
        if k < 1:
            return NO_PROPOSAL
        for n in range(min(self.max_n, len(self.tokens)), self.min_n - 1, -1):
            start = self._previous.get(n)
            if start is not None:
                return Proposal(tuple(self.tokens[start : start + k]), start, n)
        return NO_PROPOSAL


def propose_by_scan(token_ids: list[int], min_n: int, max_n: int, k: int) -> Proposal:
    """The same proposal found by scanning the whole sequence (the reference NgramIndex is tested against)."""
    end = len(token_ids)
    for n in range(min(max_n, end), min_n - 1, -1):
        suffix = token_ids[end - n :]
        for stop in range(end - 1, n - 1, -1):  # the latest occurrence ending before the suffix's own end
            if token_ids[stop - n : stop] == suffix:
                return Proposal(tuple(token_ids[stop : stop + k]), stop, n)
    return NO_PROPOSAL

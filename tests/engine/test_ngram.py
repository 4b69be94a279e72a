"""Prompt-lookup proposals: the incremental index proposes what a scan of the whole sequence finds, at every
length, for random sequences over small alphabets (many repeats), and the cases by hand."""

from __future__ import annotations

import random

import pytest

from engine.core.ngram import NO_PROPOSAL, NgramIndex, Proposal, propose_by_scan


@pytest.mark.parametrize("alphabet", [2, 3, 8])
@pytest.mark.parametrize(("min_n", "max_n"), [(1, 1), (1, 3), (2, 4), (3, 3)])
def test_the_index_proposes_what_a_scan_finds_at_every_length(alphabet, min_n, max_n):
    rng = random.Random(alphabet * 100 + min_n * 10 + max_n)
    tokens = [rng.randrange(alphabet) for _ in range(300)]
    index = NgramIndex(min_n, max_n)
    for end, token in enumerate(tokens, start=1):
        index.append(token)
        for k in (1, 4):
            assert index.propose(k) == propose_by_scan(tokens[:end], min_n, max_n, k), (end, k)


def test_the_longest_match_wins_and_its_latest_occurrence():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 1, 2, 9, 1, 2, 7, 8, 1, 2]
    index = NgramIndex(1, 3, tokens)
    # the suffix (1, 2) last occurred ending at 6 (positions 4, 5): what followed it was 7, 8, 1
    assert index.propose(3) == Proposal((7, 8, 1), 6, 2)
    index.append(7)  # suffix (1, 2, 7) occurred at 4..6: 8, 1, 2 followed
    assert index.propose(4) == Proposal((8, 1, 2, 7), 7, 3)


def test_no_earlier_occurrence_no_proposal():
    assert NgramIndex(2, 4, [1, 2, 3, 4]).propose(4) == NO_PROPOSAL
    assert NgramIndex(1, 2, [1]).propose(3) == NO_PROPOSAL
    assert NgramIndex(1, 2, [1, 1]).propose(0) == NO_PROPOSAL
    assert NgramIndex(1, 2, [1, 1]).propose(3) == Proposal((1,), 1, 1)  # a run: what followed the first 1


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramIndex(3, 2)
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramIndex(0, 2)

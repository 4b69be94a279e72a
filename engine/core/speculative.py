"""Speculative decoding's scheduler side: who proposes tokens, how many of them a step verifies, what was accepted.

A proposer (`Proposer`) offers tokens to follow a sequence; the scheduler adds them to a decode step as extra query
rows of that sequence (ScheduledSequence.spec_token_ids), the runner verifies them against the target model's own
choices (engine/worker/sampler.py's `Sampler.verify`), and the scheduler keeps the KV of the accepted ones and gives
back the blocks of the rest (Scheduler.update). Only `ngram` (prompt lookup, engine/core/ngram.py) is built; a draft
model or a suffix tree over a tenant's earlier replies would be another `Proposer`.

Extra rows are not free on a CPU: each streams no extra weights but multiplies them once more, so a step of 5 rows
takes about twice one row's time on AVX2. `SpecPlanner` therefore proposes only where the expected accepted tokens pay
for the rows, from two measurements it keeps: each sequence's acceptance (and, before it has any, the acceptance of
proposals matched on as many tokens across all sequences) and the engine's step time by number of rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from engine.core.config import EngineConfig
from engine.core.ngram import NO_PROPOSAL, NgramIndex, Proposal
from engine.core.sequence import Sequence
from engine.core.stats import SpecStats

DECAY = 0.85  # weight of a sequence's earlier verifications against its latest one
GLOBAL_DECAY = 0.98  # ... and of the engine-wide acceptance by match length
PRIOR_WEIGHT = 2.0  # how many verifications the engine-wide acceptance counts for in a sequence's estimate
# a sequence whose proposals do not pay is still given one token after PROBE_EVERY declined ones, where a token
# accepted with PROBE_CHANCE would pay for its row (and a draft's round)
PROBE_EVERY = 32
PROBE_CHANCE = 0.9
EXTRA_ROW_COST = 0.4  # a step's time per extra row, relative to one row's, until the step times say otherwise
STEP_TIME_DECAY = 0.9
DRAFT_ROUND_PRIOR = 0.3  # a draft model's decode round, relative to the target's one-row step, until measured


class Proposer(Protocol):
    """Proposes tokens to follow a sequence's tokens (never changing them). A free proposer (`free`, the default:
    n-gram lookup) offers up to k tokens through `propose`, and the planner takes a prefix of them; one whose tokens
    cost model passes (a draft model) is asked for a number of tokens per sequence through
    `generate(seqs, ks) -> tuple of tokens per sequence` and reports its time per round (`seconds_per_round`)."""

    def propose(self, seq: Sequence, k: int) -> Proposal: ...

    def forget(self, seq_id: int) -> None: ...


class NgramProposer:
    """Prompt lookup (vLLM's `ngram`): one NgramIndex per live sequence, fed the tokens it has gained since."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._indexes: dict[int, NgramIndex] = {}

    def propose(self, seq: Sequence, k: int) -> Proposal:
        index = self._indexes.get(seq.seq_id)
        if index is None or len(index) > len(seq.token_ids):  # new, or its tokens were cut (a stop string)
            index = self._indexes[seq.seq_id] = NgramIndex(self.min_n, self.max_n)
        index.extend(seq.token_ids[len(index) :])
        return index.propose(k) if k > 0 else NO_PROPOSAL

    def forget(self, seq_id: int) -> None:
        self._indexes.pop(seq_id, None)


@dataclass
class Acceptance:
    """Decayed counts of accepted proposed tokens and of rejections (a verification that kept fewer than it was
    given ends in one): the chance that a proposed token is accepted given the ones before it were is
    accepted / (accepted + rejected)."""

    accepted: float = 0.0
    rejected: float = 0.0

    def add(self, num_accepted: int, num_proposed: int, decay: float) -> None:
        self.accepted = self.accepted * decay + num_accepted
        self.rejected = self.rejected * decay + (num_accepted < num_proposed)


@dataclass
class StepTimes:
    """A decode step's seconds by its number of query rows, decayed; rows never timed are estimated from the
    nearest timed count below, at EXTRA_ROW_COST of one row's time per extra row (or from one row's)."""

    seconds: dict[int, float] = field(default_factory=dict)

    def add(self, rows: int, seconds: float) -> None:
        old = self.seconds.get(rows)
        self.seconds[rows] = (
            seconds if old is None else old * STEP_TIME_DECAY + seconds * (1 - STEP_TIME_DECAY)
        )

    def estimate(self, rows: int) -> float:
        if rows in self.seconds:
            return self.seconds[rows]
        below = [r for r in self.seconds if r < rows]
        if not below:
            return 1.0 + EXTRA_ROW_COST * (rows - 1)  # relative units: only ratios between counts matter
        base = max(below)
        one = self.seconds.get(1, self.seconds[base] / (1 + EXTRA_ROW_COST * (base - 1)))
        return self.seconds[base] + EXTRA_ROW_COST * one * (rows - base)


@dataclass
class SpecCounters:
    """Totals since start, as vLLM's spec_decode metrics count them."""

    num_drafts: int = 0  # sequences' verifications (a sequence with proposals in a step)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts whose token i was accepted
    num_steps: int = 0  # steps with at least one verification
    # accepted tokens whose proposal was copied from the sequence's prompt (Proposal.source before its first output
    # token) rather than from its own reply so far
    accepted_from_prompt: int = 0


@dataclass
class _Candidate:
    seq: Sequence
    tokens: tuple[int, ...]
    chance: float  # of accepting a token given the ones before it
    k: int = 0
    gain: float = 1.0  # the chance of accepting the k-th proposed token: chance ** k


class SpecPlanner:
    """Picks each decode step's proposed tokens (see the module docstring) and keeps the measurements behind it."""

    def __init__(self, proposer: Proposer, max_tokens: int, max_rows: int) -> None:
        self.proposer = proposer
        self.max_tokens = max_tokens
        self.max_rows = max_rows  # a step's query rows stay within the kernels' few-row (row-exact) path
        self.step_times = StepTimes()
        self.counters = SpecCounters()
        self._seq_acceptance: dict[int, Acceptance] = {}
        self._by_match: dict[int, Acceptance] = {}  # n-gram length -> acceptance across sequences
        self._declined: dict[int, int] = {}  # seq_id -> proposals declined since its last verification
        # seq_id -> its proposal in flight: the n-gram length it matched on, and whether it came from the prompt
        self._in_flight: dict[int, tuple[int, bool]] = {}
        # the last plan's time in a draft model's generate() (the scheduler zeroes it every step): the engine's step
        # time without it is the target's
        self.proposing_seconds = 0.0

    def plan(
        self, seqs: list[Sequence], max_model_len: int, max_rows: int | None = None
    ) -> list[tuple[int, ...]]:
        """Proposed tokens for each of a decode step's sequences (one row each so far; () for none), the step's
        rows within `max_rows` (the scheduler's token budget) as well as the kernels' bound."""
        rows = len(seqs)
        plans: list[tuple[int, ...]] = [()] * rows
        row_cap = self.max_rows if max_rows is None else min(self.max_rows, max_rows)
        if rows >= row_cap:
            return plans
        free = getattr(self.proposer, "free", True)
        candidates: list[tuple[int, _Candidate]] = []
        for i, seq in enumerate(seqs):
            # the bonus token counts: at most max_tokens - 1 more, and the last position within max_model_len
            room = min(
                self.max_tokens,
                seq.params.max_tokens - seq.num_output_tokens - 1,
                max_model_len - len(seq),
            )
            if room < 1 or not seq.params.speculative:
                continue
            if free:  # its proposal costs nothing to look at: the planner takes a prefix of it
                proposal = self.proposer.propose(seq, room)
                if not proposal.token_ids:
                    continue
                tokens, match_len = proposal.token_ids, proposal.ngram
                from_prompt = 0 <= proposal.source < seq.num_prompt_tokens
            else:  # a draft model's: how many it is asked for is decided first (its tokens cost rounds)
                tokens, match_len, from_prompt = (0,) * room, 0, False
            self._in_flight[seq.seq_id] = (match_len, from_prompt)
            candidates.append((i, _Candidate(seq, tokens, self._chance(seq.seq_id, match_len))))
        if not candidates:
            return plans
        round_cost = 0.0 if free else self._draft_round_cost()
        expected, rounds = float(rows), 0
        step_time = self.step_times.estimate(rows)
        while rows < row_cap:
            best, best_rate, best_time = None, expected / step_time, step_time
            for _, c in candidates:
                if c.k < len(c.tokens):
                    next_time = self.step_times.estimate(rows + 1) + round_cost * max(rounds, c.k + 1)
                    rate = (expected + c.gain * c.chance) / next_time
                    if rate > best_rate:
                        best, best_rate, best_time = c, rate, next_time
            if best is None:
                break
            expected += best.gain * best.chance
            best.gain *= best.chance
            best.k += 1
            rounds = max(rounds, best.k)
            rows += 1
            step_time = best_time
        # a probe of one token, for a sequence whose proposals did not pay lately, where one likely to be accepted
        # would pay (always for n-gram lookup; a draft model's round may cost more than the token is worth)
        one_row = self.step_times.estimate(len(seqs))
        probe_pays = (len(seqs) + PROBE_CHANCE) / (self.step_times.estimate(len(seqs) + 1) + round_cost) > (
            len(seqs) / one_row
        )
        chosen: list[tuple[int, _Candidate]] = []
        for i, c in candidates:
            seq_id = c.seq.seq_id
            if c.k == 0:
                declined = self._declined.get(seq_id, 0) + 1
                if declined < PROBE_EVERY or rows >= row_cap or not probe_pays:
                    self._declined[seq_id] = declined
                    continue
                c.k, rows = 1, rows + 1  # a probe: the sequence's text may have turned to copying
            self._declined[seq_id] = 0
            chosen.append((i, c))
        if free:
            for i, c in chosen:
                plans[i] = c.tokens[: c.k]
        elif chosen:
            started = time.perf_counter()
            drafted = self.proposer.generate([c.seq for _, c in chosen], [c.k for _, c in chosen])
            self.proposing_seconds = time.perf_counter() - started
            for (i, _), tokens in zip(chosen, drafted, strict=True):
                plans[i] = tokens
        return plans

    def _draft_round_cost(self) -> float:
        """A draft round's cost in the step times' units: measured, or DRAFT_ROUND_PRIOR of a one-row step."""
        measured = getattr(self.proposer, "seconds_per_round", None)
        if measured is None or 1 not in self.step_times.seconds:
            return DRAFT_ROUND_PRIOR * self.step_times.estimate(1)
        return measured

    def _chance(self, seq_id: int, match_len: int) -> float:
        prior = self._by_match.get(match_len)
        prior_chance = 0.5 if prior is None else (prior.accepted + 1) / (prior.accepted + prior.rejected + 2)
        own = self._seq_acceptance.get(seq_id)
        if own is None:
            return prior_chance
        return (own.accepted + PRIOR_WEIGHT * prior_chance) / (own.accepted + own.rejected + PRIOR_WEIGHT)

    def record(self, seq_id: int, num_proposed: int, num_accepted: int) -> None:
        """A verification's outcome: `num_accepted` of the sequence's `num_proposed` tokens were kept."""
        self._seq_acceptance.setdefault(seq_id, Acceptance()).add(num_accepted, num_proposed, DECAY)
        match_len, from_prompt = self._in_flight.get(seq_id, (0, False))
        self._by_match.setdefault(match_len, Acceptance()).add(num_accepted, num_proposed, GLOBAL_DECAY)
        c = self.counters
        c.num_drafts += 1
        c.num_draft_tokens += num_proposed
        c.num_accepted_tokens += num_accepted
        if from_prompt:
            c.accepted_from_prompt += num_accepted
        while len(c.accepted_per_position) < num_proposed:
            c.accepted_per_position.append(0)
        for i in range(num_accepted):
            c.accepted_per_position[i] += 1

    def stats(self, method: str) -> SpecStats:
        c = self.counters
        return SpecStats(
            method,
            c.num_drafts,
            c.num_draft_tokens,
            c.num_accepted_tokens,
            tuple(c.accepted_per_position),
            c.num_steps,
            c.accepted_from_prompt,
        )

    def release(self, seq_id: int) -> None:
        """A sequence was preempted: what its proposer holds for it goes (a draft's blocks); its estimates stay."""
        self.proposer.forget(seq_id)

    def forget(self, seq_id: int) -> None:
        """A sequence finished: its index and estimates go."""
        self.proposer.forget(seq_id)
        self._seq_acceptance.pop(seq_id, None)
        self._declined.pop(seq_id, None)
        self._in_flight.pop(seq_id, None)


def make_spec_planner(
    config: EngineConfig, max_rows: int, draft: Proposer | None = None
) -> SpecPlanner | None:
    """The planner of `config.speculative_method` for steps of at most `max_rows` query rows (the draft method's
    proposer, engine/worker/draft.py, is built by the engine, which loads its model), or None (off)."""
    if config.speculative_method == "off":
        return None
    if config.speculative_method == "ngram":
        return SpecPlanner(
            NgramProposer(config.ngram_min, config.ngram_max), config.num_speculative_tokens, max_rows
        )
    if config.speculative_method == "draft" and draft is not None:
        return SpecPlanner(draft, config.num_speculative_tokens, max_rows)
    raise ValueError(f"speculative_method {config.speculative_method!r} needs its proposer")

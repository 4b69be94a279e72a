"""The scheduler's side of speculative decoding (issue #40): proposed tokens as extra rows of a decode step, the KV of
the rejected ones rolled back, only verified tokens hashed into the prefix cache, stops inside accepted tokens, and
no preemption for a proposal. A fake model verifies proposals against its deterministic next token."""

from __future__ import annotations

import pytest

from engine.core.ngram import Proposal
from engine.core.outputs import SchedulerOutput
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.core.speculative import SpecPlanner
from engine.core.utils import cdiv
from tests.engine.scheduler_factories import (
    EOS,
    FakeModel,
    add,
    live_seqs,
    make_prompt,
    make_scheduler,
    make_seq,
    next_token,
    run_to_completion,
)


class ChainProposer:
    """Proposes the fake model's own next tokens, but the one at proposal position `wrong_at(seq, k)` (if any) is
    off by one: so a verification keeps the tokens before it and rejects the rest."""

    def __init__(self, wrong_at=lambda seq, k: None, source=lambda seq: 0) -> None:
        self.wrong_at = wrong_at
        self.source = source  # where the proposal says it was copied from
        self.proposed = 0

    def propose(self, seq: Sequence, k: int) -> Proposal:
        context, tokens = list(seq.token_ids), []
        wrong = self.wrong_at(seq, k)
        for j in range(k):
            token = next_token(context)
            tokens.append(token + 1 if j == wrong else token)
            context.append(token)
        self.proposed += len(tokens)
        return Proposal(tuple(tokens), self.source(seq), 3)

    def forget(self, seq_id: int) -> None:
        pass


def spec_scheduler(num_blocks: int, proposer, max_tokens: int = 4, **overrides) -> Scheduler:
    sched = make_scheduler(num_blocks, **overrides)
    planner = SpecPlanner(proposer, max_tokens, max_rows=16)
    for rows in range(1, 17):
        planner.step_times.add(rows, 1.0)  # rows cost nothing extra: every proposed token is taken
    sched.spec = planner
    return sched


class VerifyingModel(FakeModel):
    """FakeModel that also writes the proposed tokens' KV and accepts each while it is the model's next token."""

    def step(self, sched: Scheduler, out: SchedulerOutput) -> tuple[dict[int, int], dict[int, list[int]]]:
        bs = self.block_size
        for src, dst in out.block_copies:
            self.kv[dst] = list(self.kv[src])
        sampled, accepted = {}, {}
        for s in out.scheduled:
            seq = s.seq
            tokens = seq.token_ids + list(s.spec_token_ids)
            start = seq.num_computed_tokens
            for pos in range(start, start + s.num_rows):
                self.kv[seq.block_table[pos // bs]][pos % bs] = tokens[pos]
            if not s.samples:
                continue
            context = [self.kv[seq.block_table[p // bs]][p % bs] for p in range(len(seq))]
            assert context == seq.token_ids, f"seq {seq.seq_id} reads a corrupted context"
            kept = []
            for token in s.spec_token_ids:
                if token != next_token(context):
                    break
                kept.append(token)
                context.append(token)
            accepted[seq.seq_id] = kept
            sampled[seq.seq_id] = next_token(context)
        return sampled, accepted


def run(sched: Scheduler, model: VerifyingModel) -> list[SchedulerOutput]:
    outputs = []
    while sched.has_unfinished():
        assert len(outputs) < 2000, "no progress"
        out = sched.schedule()
        assert out.num_batched_tokens <= sched.max_num_batched_tokens  # proposed tokens count
        sampled, accepted = model.step(sched, out)
        for seq, _ in zip(*out.sampling_rows(), strict=True):  # forked samples: their own first token
            sampled.setdefault(seq.seq_id, next_token(seq.token_ids) + 1000 * seq.sample_index)
        sched.update(out, sampled, accepted=accepted)
        sched.block_manager.check_invariants(live_seqs(sched), sched.held_block_ids())
        for seq in sched.running:  # no cached block holds a token that was not verified
            assert seq.num_hashed_blocks * sched.config.block_size <= seq.num_computed_tokens
        outputs.append(out)
    assert sched.block_manager.stats().num_used_blocks == 0
    return outputs


def requests(n: int = 6) -> list[Sequence]:
    seqs = []
    for i in range(n):
        prompt = make_prompt(20 + 7 * i, seed=i % 3)  # seeds repeat: prefixes shared and cached
        seqs.append(make_seq(i, prompt, max_tokens=30 + i, ignore_eos=True, n=2 if i == 3 else 1))
    return seqs


def outputs_of(seqs: list[Sequence], forks) -> list[list[int]]:
    return [s.output_token_ids for s in [*seqs, *forks]]


@pytest.mark.parametrize("num_blocks", [64, 18])  # 18: preemptions
def test_speculation_gives_the_tokens_of_plain_decoding(num_blocks):
    plain = make_scheduler(num_blocks)
    plain_seqs = requests()
    plain_forks = [f for s in plain_seqs for f in add(plain, s)]
    run_to_completion(plain)

    proposer = ChainProposer(wrong_at=lambda seq, k: (len(seq) % (k + 2)) if len(seq) % 3 else None)
    sched = spec_scheduler(num_blocks, proposer)
    seqs = requests()
    forks = [f for s in seqs for f in add(sched, s)]
    outs = run(sched, VerifyingModel(num_blocks, sched.config.block_size))
    assert outputs_of(seqs, forks) == outputs_of(plain_seqs, plain_forks)
    counters = sched.spec.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens <= proposer.proposed
    assert sum(out.num_spec_tokens for out in outs) == counters.num_draft_tokens
    assert sched.num_generation_tokens_total == plain.num_generation_tokens_total
    if num_blocks == 18:
        assert sched.num_preemptions > 0


def test_rejected_proposals_give_their_blocks_back():
    sched = spec_scheduler(
        32, ChainProposer(wrong_at=lambda seq, k: 0), max_tokens=12
    )  # every proposal wrong
    seq = make_seq(0, make_prompt(15), max_tokens=20, ignore_eos=True)
    add(sched, seq)
    model = VerifyingModel(32, 8)
    out = sched.schedule()  # the prompt
    sched.update(out, *model.step(sched, out)[:1])
    free_before = len(sched.block_manager.free_queue)
    out = sched.schedule()  # position 15: 1 + 12 rows reach position 27, block 3
    assert out.scheduled[0].spec_token_ids and len(seq.block_table) == cdiv(15 + 13, 8)
    sampled, accepted = model.step(sched, out)
    assert accepted == {0: []}
    sched.update(out, sampled, accepted=accepted)
    assert seq.num_computed_tokens == 16 and len(seq.token_ids) == 17
    assert len(seq.block_table) == 2 and len(sched.block_manager.free_queue) == free_before
    assert seq.num_hashed_blocks == 2  # positions 0..15: verified, hashed; nothing past them
    assert (seq.num_draft_tokens, seq.num_accepted_tokens) == (12, 0)


def test_an_accepted_eos_ends_the_sequence_and_the_tokens_after_it_are_not_kept():
    sched = spec_scheduler(32, ChainProposer(), max_tokens=4)
    seq = make_seq(0, make_prompt(10), max_tokens=20)
    add(sched, seq)
    model = VerifyingModel(32, 8)
    out = sched.schedule()
    sched.update(out, model.step(sched, out)[0])
    out = sched.schedule()
    first, _, third, fourth = out.scheduled[0].spec_token_ids
    out.scheduled[0].spec_token_ids = (first, EOS, third, fourth)  # as if the proposer had offered an EOS
    sched.update(out, {0: 99}, accepted={0: [first, EOS, third]})  # kept past it: cut at the EOS
    assert seq.is_finished and seq.output_token_ids[-2:] == [first, EOS] and seq.num_new_tokens == 2
    assert sched.block_manager.stats().num_used_blocks == 0


def test_max_tokens_is_exact_with_proposals():
    sched = spec_scheduler(64, ChainProposer(), max_tokens=8)
    seqs = [
        make_seq(i, make_prompt(12, seed=i), max_tokens=m, ignore_eos=True)
        for i, m in enumerate([1, 2, 9, 17])
    ]
    for s in seqs:
        add(sched, s)
    run(sched, VerifyingModel(64, 8))
    assert [s.num_output_tokens for s in seqs] == [1, 2, 9, 17]
    assert sched.spec.counters.num_accepted_tokens == sched.spec.counters.num_draft_tokens > 0


@pytest.mark.parametrize("from_prompt", [True, False])
def test_accepted_tokens_are_counted_by_where_their_proposal_came_from(from_prompt):
    # a proposal copied from before the sequence's first output token came from its prompt, else from its reply
    source = (lambda seq: seq.num_prompt_tokens - 1) if from_prompt else (lambda seq: seq.num_prompt_tokens)
    sched = spec_scheduler(64, ChainProposer(source=source), max_tokens=4)
    add(sched, make_seq(0, make_prompt(12), max_tokens=20, ignore_eos=True))
    run(sched, VerifyingModel(64, 8))
    counters = sched.spec.counters
    assert counters.num_accepted_tokens > 0
    assert counters.accepted_from_prompt == (counters.num_accepted_tokens if from_prompt else 0)


def test_no_proposals_beside_a_prompt_chunk_for_structured_requests_or_requests_that_opt_out():
    sched = spec_scheduler(64, ChainProposer())
    add(sched, make_seq(0, make_prompt(10), max_tokens=20, ignore_eos=True))
    model = VerifyingModel(64, 8)
    out = sched.schedule()
    sched.update(out, model.step(sched, out)[0])
    add(sched, make_seq(1, make_prompt(40, seed=1), max_tokens=5, ignore_eos=True))
    out = sched.schedule()  # seq 0 decodes beside seq 1's prompt: one row each way
    assert [s.spec_token_ids for s in out.scheduled] == [(), ()]
    sched.update(out, *model.step(sched, out)[:1])
    out = sched.schedule()
    assert all(s.spec_token_ids for s in out.scheduled)
    sched.update(out, *model.step(sched, out)[:1], accepted={s.seq.seq_id: [] for s in out.scheduled})

    opted_out = spec_scheduler(64, ChainProposer())
    add(opted_out, make_seq(0, make_prompt(10), max_tokens=20, ignore_eos=True, speculative=False))
    outs = run(opted_out, VerifyingModel(64, 8))
    assert sum(out.num_spec_tokens for out in outs) == 0


def test_a_proposal_never_preempts():
    # two sequences at the last slot of their second block, and no free block: a proposal would need one
    sched = spec_scheduler(4, ChainProposer(), max_tokens=4)
    for i in range(2):
        add(sched, make_seq(i, make_prompt(15, seed=i), max_tokens=9, ignore_eos=True))
    model = VerifyingModel(4, 8)
    out = sched.schedule()
    sched.update(out, model.step(sched, out)[0])
    assert len(sched.block_manager.free_queue) == 0
    out = sched.schedule()
    assert [len(s.spec_token_ids) for s in out.scheduled] == [0, 0] and not out.preempted


def test_proposed_tokens_stay_within_the_steps_token_budget():
    sched = spec_scheduler(64, ChainProposer(), max_tokens=8, max_num_batched_tokens=8)
    seqs = [make_seq(i, make_prompt(6, seed=i), max_tokens=20, ignore_eos=True) for i in range(3)]
    for s in seqs:
        add(sched, s)
    outs = run(sched, VerifyingModel(64, 8))
    assert max(out.num_batched_tokens for out in outs if out.num_spec_tokens) == 8

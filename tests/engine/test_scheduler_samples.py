"""Scheduler: a request's n samples fork from its first in the step that computes the prompt's last token."""

from __future__ import annotations

import pytest

from engine.core.sequence import FinishReason, SequenceStatus
from tests.engine.scheduler_factories import (
    FakeModel,
    add,
    make_child,
    make_prompt,
    make_scheduler,
    make_seq,
    run_to_completion,
    step,
)


def test_fork_shares_blocks_then_copies_the_partial_tail() -> None:
    sched = make_scheduler()
    parent = make_seq(0, make_prompt(17), n=3, max_tokens=3)
    add(sched, parent)
    model = FakeModel(64, 8)
    out, _, got = step(sched, model)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.forked] == [(10_001, 17), (10_002, 17)]
    assert [s.seq_id for s in got] == [0, 10_001, 10_002]
    assert [s.output_token_ids[0] - parent.output_token_ids[0] for s in got] == [0, 1000, 2000]
    assert sched.running == got and sched.get_sequences("r0") == got
    assert got[1].block_table == got[2].block_table == parent.block_table == [0, 1, 2]
    assert [b.ref_count for b in sched.block_manager.blocks[:4]] == [3, 3, 3, 0]
    assert [s.num_hashed_blocks for s in got] == [2, 2, 2]
    assert sched.stats().num_shared_blocks == 3
    out, scheduled, _ = step(sched, model)
    assert scheduled == [(0, 1, True), (10_001, 1, True), (10_002, 1, True)] and out.forked == []
    assert out.block_copies == [(2, 3), (2, 4)]  # the last writer of block 2 owns it alone by then
    assert [s.block_table for s in got] == [[0, 1, 3], [0, 1, 4], [0, 1, 2]]
    run_to_completion(sched, model)
    assert len({tuple(s.output_token_ids) for s in got}) == 3
    assert [s.num_output_tokens for s in got] == [3, 3, 3]


def test_forked_samples_draw_from_their_first_samples_logits_row() -> None:
    sched = make_scheduler()
    model = FakeModel(64, 8)
    add(sched, make_seq(0, make_prompt(5), max_tokens=4))
    step(sched, model)
    add(sched, make_seq(1, make_prompt(9, 1), n=2))
    add(sched, make_seq(2, make_prompt(70, 2)))  # only 54 of its tokens fit the budget: it does not sample
    out = sched.schedule()
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1), (1, 9), (2, 54)]
    seqs, rows = out.sampling_rows()
    assert ([s.seq_id for s in seqs], rows) == ([0, 1, 10_101], [0, 1, 1])


def test_forked_samples_do_not_stop_on_the_prompt_token() -> None:
    sched = make_scheduler()
    parent = make_seq(0, [*make_prompt(9), 77], n=2, stop_token_ids=[77], max_tokens=2)
    add(sched, parent)
    _, _, got = step(sched, FakeModel(64, 8))
    assert [(s.seq_id, s.num_output_tokens, s.is_finished) for s in got] == [
        (0, 1, False),
        (10_001, 1, False),
    ]


def test_admission_counts_every_sample_of_a_request() -> None:
    sched = make_scheduler(max_num_seqs=3, max_num_batched_tokens=8)
    first = make_seq(0, make_prompt(10), n=2)
    add(sched, first)
    model = FakeModel(64, 8)
    step(sched, model)  # first prompt chunk: not forked yet, but it will need 2 slots
    add(sched, make_seq(1, make_prompt(5, 1), n=2))
    _, scheduled, got = step(sched, model)
    assert scheduled == [(0, 2, True)] and [s.seq_id for s in got] == [0, 10_001]
    assert sched.num_waiting == 1
    sched.add_sequence(make_seq(2, make_prompt(5, 2)))
    # one slot is free, but FCFS: the n=2 request at the head blocks the one behind it
    assert [s.seq.seq_id for s in sched.schedule().scheduled] == [0, 10_001]
    assert [s.seq_id for s in sched.waiting] == [1, 2]


def test_a_one_token_request_finishes_every_sample_in_its_first_step() -> None:
    sched = make_scheduler()
    one_token = make_seq(0, make_prompt(10), n=2, max_tokens=1)
    add(sched, one_token)
    _, _, got = step(sched, FakeModel(64, 8))
    assert [s.finish_reason for s in got] == [FinishReason.LENGTH, FinishReason.LENGTH]
    assert not sched.has_unfinished()
    assert sched.schedule().finished_seq_ids == [0, 10_001]


def test_abort_before_the_fork_finishes_the_samples_not_started() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    parent = make_seq(0, make_prompt(20), n=3, max_tokens=4)
    forks = add(sched, parent)
    out, _, got = step(sched, FakeModel(64, 8))  # the first prompt chunk: nothing samples, nothing forks
    assert (got, out.forked, sched.get_sequences("r0")) == ([], [], [parent])
    assert sched.abort("r0", FinishReason.ERROR) == [parent]
    assert [(s.status, s.finish_reason, s.block_table) for s in [parent, *forks]] == [
        (SequenceStatus.FINISHED, FinishReason.ERROR, [])
    ] * 3
    assert not sched.has_unfinished() and sched.block_manager.stats().num_used_blocks == 0
    assert sched.schedule().finished_seq_ids == [0, 10_001, 10_002]


def test_a_request_of_n_samples_must_bring_its_forks() -> None:
    sched = make_scheduler()
    parent = make_seq(0, make_prompt(10), n=3)
    with pytest.raises(RuntimeError, match=r"n=3 needs 2 sequences to fork with its prompt, got 1"):
        sched.add_sequence(parent, [make_child(parent, 1)])
    other_prompt = make_child(parent, 2)
    other_prompt.token_ids[-1] += 1
    with pytest.raises(RuntimeError, match="got 2"):
        sched.add_sequence(parent, [make_child(parent, 1), other_prompt])
    assert not sched.has_unfinished()

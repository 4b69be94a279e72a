"""Scheduler: batching limits, chunked prefill, preemption, prefix hits, stops, stats."""

from __future__ import annotations

import pytest

from engine.core.config import EngineConfig
from engine.core.outputs import SchedulerOutput
from engine.core.scheduler import Scheduler
from engine.core.sequence import FinishReason, Sequence
from tests.engine.scheduler_factories import (
    EOS,
    FakeModel,
    make_prompt,
    make_scheduler,
    make_seq,
    run_to_completion,
    step,
)


def test_max_num_seqs_limits_running() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for i in range(3):
        sched.add_sequence(make_seq(i, make_prompt(5, i)))
    out = sched.schedule()
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 5), (1, 5)]
    assert (sched.num_running, sched.num_waiting) == (2, 1)


def test_token_budget_splits_prefills() -> None:
    sched = make_scheduler(max_num_batched_tokens=16)
    seqs = [make_seq(i, make_prompt(10, i)) for i in range(3)]
    for seq in seqs:
        sched.add_sequence(seq)
    model = FakeModel(64, 8)
    _, scheduled, got = step(sched, model)
    assert scheduled == [(0, 10, True), (1, 6, False)]
    assert got == [seqs[0]]
    _, scheduled, got = step(sched, model)
    assert scheduled == [(0, 1, True), (1, 4, True), (2, 10, True)]
    assert got == seqs


def test_chunked_prefill_matches_an_unchunked_run() -> None:
    prompt = make_prompt(30)
    sched = make_scheduler(max_num_batched_tokens=13)
    seq = make_seq(0, prompt, max_tokens=3)
    sched.add_sequence(seq)
    model = FakeModel(64, 8)
    chunks = []
    while sched.has_unfinished():
        _, scheduled, _ = step(sched, model)
        chunks.append((*scheduled[0][1:], len(seq.block_table)))
    # the last step samples the 3rd token, finishes the sequence and frees its blocks
    assert chunks == [(13, False, 2), (13, False, 4), (4, True, 4), (1, True, 4), (1, True, 0)]
    reference = make_seq(1, prompt, max_tokens=3)
    unchunked = make_scheduler()
    unchunked.add_sequence(reference)
    assert len(run_to_completion(unchunked)) == 3
    assert seq.output_token_ids == reference.output_token_ids
    assert seq.finish_reason is reference.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_preempted_sequences_resume_with_the_same_tokens(enable_prefix_caching: bool) -> None:
    def run(num_blocks: int) -> tuple[Scheduler, list[Sequence], list[SchedulerOutput]]:
        sched = make_scheduler(num_blocks, enable_prefix_caching=enable_prefix_caching)
        seqs = [make_seq(i, make_prompt(12, i), max_tokens=20) for i in range(3)]
        for seq in seqs:
            sched.add_sequence(seq)
        return sched, seqs, run_to_completion(sched)

    tight, tight_seqs, tight_outputs = run(num_blocks=6)
    roomy, roomy_seqs, _ = run(num_blocks=64)
    assert roomy.num_preemptions == 0
    assert tight.num_preemptions > 0
    assert tight.num_preemptions == sum(s.num_preemptions for s in tight_seqs)
    assert sum(len(out.preempted) for out in tight_outputs) == tight.num_preemptions
    assert [s.token_ids for s in tight_seqs] == [s.token_ids for s in roomy_seqs]
    assert all(s.finish_reason is FinishReason.LENGTH and s.num_output_tokens == 20 for s in tight_seqs)


def test_waste_stays_under_one_block_per_running_sequence() -> None:
    sched = make_scheduler(num_blocks=10, max_num_batched_tokens=13)
    for i in range(4):
        sched.add_sequence(make_seq(i, make_prompt(5 + 7 * i, i), max_tokens=9))
    model = FakeModel(10, 8)
    max_running = 0
    while sched.has_unfinished():
        step(sched, model)
        stats = sched.stats()
        max_running = max(max_running, stats.num_running)
        for seq in sched.running:
            assert 0 <= len(seq.block_table) * 8 - seq.num_computed_tokens < 8
        assert stats.num_slots_allocated - stats.num_tokens_stored < 8 * max(1, stats.num_running)
    assert max_running >= 2


def test_shared_prefix_is_served_from_the_cache() -> None:
    sched = make_scheduler(block_size=16, max_num_batched_tokens=512)
    prefix = make_prompt(300)
    a = make_seq(0, prefix, max_tokens=4)
    sched.add_sequence(a)
    model = FakeModel(64, 16)
    step(sched, model)
    b = make_seq(1, prefix + make_prompt(20, seed=1), max_tokens=4)
    sched.add_sequence(b)
    _, scheduled, _ = step(sched, model)  # a decodes while b is admitted next to it
    assert b.num_cached_tokens == 288
    assert scheduled == [(0, 1, True), (1, 32, True)]
    assert (sched.stats().prefix_query_tokens, sched.stats().prefix_hit_tokens) == (620, 288)
    assert b.block_table[:18] == a.block_table[:18]
    run_to_completion(sched, model)


def test_next_conversation_turn_reuses_prompt_and_answer() -> None:
    sched = make_scheduler(block_size=16, max_num_batched_tokens=512)
    first = make_seq(0, make_prompt(100), max_tokens=20)
    sched.add_sequence(first)
    run_to_completion(sched)
    assert len(first) == 120
    second = make_seq(1, [*first.token_ids, *make_prompt(15, seed=3)], max_tokens=2)
    sched.add_sequence(second)
    sched.schedule()
    assert second.num_cached_tokens == (120 - 1) // 16 * 16 == 112
    assert sched.block_manager.stats().num_cached_blocks == 0  # all 7 cached blocks back in use, tail reused


def test_stop_conditions() -> None:
    sched = make_scheduler(max_model_len=16)
    eos, ignore, stop_tok, length = (
        make_seq(0, make_prompt(4)),
        make_seq(1, make_prompt(4), ignore_eos=True, max_tokens=2),
        make_seq(2, make_prompt(4), stop_token_ids=[77]),
        make_seq(3, make_prompt(14), max_tokens=10),
    )
    for seq in (eos, ignore, stop_tok, length):
        sched.add_sequence(seq)
    out = sched.schedule()
    got = sched.update(out, {0: EOS, 1: EOS, 2: 77, 3: 50}, now=5.0)
    assert got == [eos, ignore, stop_tok, length]
    assert out.finished_seq_ids == []
    assert (eos.finish_reason, eos.stop_reason, eos.first_token_time) == (FinishReason.STOP, None, 5.0)
    assert (stop_tok.finish_reason, stop_tok.stop_reason) == (FinishReason.STOP, 77)
    assert not ignore.is_finished and not length.is_finished
    assert sched.running == [ignore, length]
    out = sched.schedule()
    assert out.finished_seq_ids == [0, 2]
    sched.update(out, {1: EOS, 3: 51}, now=6.0)
    assert ignore.finish_reason is FinishReason.LENGTH and ignore.output_token_ids == [EOS, EOS]
    assert length.finish_reason is FinishReason.LENGTH and len(length) == 16
    assert ignore.first_token_time == 5.0
    assert not sched.has_unfinished() and sched.block_manager.stats().num_used_blocks == 0
    assert sched.schedule().finished_seq_ids == [1, 3]  # 0 and 2 were reported by the second schedule()


def test_abort_frees_running_and_waiting_sequences() -> None:
    sched = make_scheduler(max_num_seqs=1)
    running, waiting = make_seq(0, make_prompt(9)), make_seq(1, make_prompt(9, 1))
    sched.add_sequence(running)
    sched.add_sequence(waiting)
    sched.schedule()
    assert sched.block_manager.stats().num_used_blocks == 2
    assert sched.abort("r1") == [waiting]
    assert sched.abort("r0") == [running]
    assert sched.abort("r0") == [] and sched.abort("nope") == []
    assert running.finish_reason is waiting.finish_reason is FinishReason.ABORT
    assert running.block_table == [] and not sched.has_unfinished()
    assert sched.block_manager.stats().num_used_blocks == 0
    assert sched.get_sequences("r0") == []


def test_sequence_larger_than_the_pool_is_rejected() -> None:
    sched = make_scheduler(num_blocks=4)
    with pytest.raises(
        ValueError, match=r"prompt \+ max_tokens \(34 tokens\) needs 5 KV blocks, the pool has 4"
    ):
        sched.add_sequence(make_seq(0, make_prompt(30), max_tokens=4))
    sched.add_sequence(make_seq(1, make_prompt(30), max_tokens=3))


def test_stats_and_snapshot() -> None:
    sched = make_scheduler(num_blocks=8, max_num_seqs=1)
    a, b = make_seq(0, make_prompt(10), max_tokens=4), make_seq(1, make_prompt(3, 1), max_tokens=4)
    sched.add_sequence(a)
    sched.add_sequence(b)
    step(sched, FakeModel(8, 8))
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_preemptions) == (1, 1, 0)
    assert (stats.num_blocks, stats.num_free_blocks, stats.num_cached_blocks, stats.num_used_blocks) == (
        8,
        6,
        0,
        2,
    )
    assert (stats.num_tokens_stored, stats.num_slots_allocated, stats.num_shared_blocks) == (10, 16, 0)
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (10, 0)
    assert (stats.num_prompt_tokens_total, stats.num_generation_tokens_total, stats.num_steps) == (10, 1, 1)
    assert (stats.block_size, stats.max_model_len) == (8, 512)
    snap = sched.snapshot()
    assert snap.block_states == [2, 2, 0, 0, 0, 0, 0, 0]
    assert snap.ref_counts == [1, 1, 0, 0, 0, 0, 0, 0]
    assert snap.block_hash_prefixes == {0: a.block_hashes[0].hex()[:8]}
    assert snap.sequences == [
        {"seq_id": 0, "request_id": "r0", "block_table": [0, 1], "num_tokens": 11, "num_computed_tokens": 10,
         "num_prompt_tokens": 10, "num_cached_tokens": 0, "status": "running"},
        {"seq_id": 1, "request_id": "r1", "block_table": [], "num_tokens": 3, "num_computed_tokens": 0,
         "num_prompt_tokens": 3, "num_cached_tokens": 0, "status": "waiting"},
    ]  # fmt: skip
    assert snap.stats.num_steps == 1


def test_unresolved_config_is_a_caller_bug() -> None:
    with pytest.raises(RuntimeError, match="resolved"):
        Scheduler(EngineConfig(), 16, frozenset({EOS}))

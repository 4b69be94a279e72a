"""What the scheduler counts and stamps for metrics: prompt tokens with vLLM's meaning, computed ones, timestamps."""

from __future__ import annotations

from engine.core.outputs import RequestMetrics
from tests.engine.scheduler_factories import (
    FakeModel,
    add,
    make_prompt,
    make_scheduler,
    make_seq,
    run_to_completion,
    step,
)


def test_prompt_tokens_count_cached_ones_too_and_computed_ones_only_what_ran() -> None:
    sched, model = make_scheduler(), FakeModel(64, 8)  # one model: its KV pool holds the cached blocks
    prompt = make_prompt(27)
    sched.add_sequence(make_seq(0, prompt, max_tokens=2))
    run_to_completion(sched, model)
    again = make_seq(1, prompt, max_tokens=2)
    sched.add_sequence(again)
    run_to_completion(sched, model)
    stats = sched.stats()
    assert again.num_cached_tokens == 24  # three full blocks of 8 came from the prefix cache
    assert stats.num_prompt_tokens_total == 27 + 27
    assert stats.num_computed_prompt_tokens_total == 27 + 3


def test_a_request_with_n_samples_counts_its_prompt_once() -> None:
    sched = make_scheduler()
    seq = make_seq(0, make_prompt(10), max_tokens=3, n=3, seed=1)
    add(sched, seq)
    run_to_completion(sched)
    stats = sched.stats()
    assert stats.num_prompt_tokens_total == 10
    assert stats.num_generation_tokens_total == 9


def test_recomputation_after_preemption_counts_as_computed_only() -> None:
    sched = make_scheduler(num_blocks=6, enable_prefix_caching=False)
    seqs = [make_seq(i, make_prompt(12, i), max_tokens=20) for i in range(3)]
    for seq in seqs:
        sched.add_sequence(seq)
    model = FakeModel(6, 8)
    scheduled_at: dict[int, float] = {}
    while sched.has_unfinished():
        step(sched, model)
        for seq in seqs:  # the first admission's time stays through preemptions
            if seq.first_scheduled_time is not None:
                assert (
                    scheduled_at.setdefault(seq.seq_id, seq.first_scheduled_time) == seq.first_scheduled_time
                )
    stats = sched.stats()
    assert stats.num_preemptions > 0
    assert stats.num_prompt_tokens_total == 36
    assert stats.num_computed_prompt_tokens_total > 36  # preempted prompts ran again
    for seq in seqs:
        times = RequestMetrics(
            arrival_time=seq.arrival_time,
            first_scheduled_time=seq.first_scheduled_time,
            first_token_time=seq.first_token_time,
            last_token_time=seq.last_token_time,
        )
        assert times.queue_time is not None and times.queue_time >= 0
        assert times.prefill_time is not None and times.prefill_time >= 0
        assert times.decode_time is not None and times.decode_time > 0
        assert times.inference_time == times.prefill_time + times.decode_time


def test_unscheduled_spans_are_none() -> None:
    times = RequestMetrics(arrival_time=1.0)
    assert (times.queue_time, times.prefill_time, times.decode_time, times.inference_time) == (None,) * 4
    times = RequestMetrics(
        arrival_time=1.0, first_scheduled_time=1.5, first_token_time=2.0, last_token_time=3.25
    )
    assert (times.queue_time, times.prefill_time, times.decode_time, times.inference_time) == (
        0.5,
        0.5,
        1.25,
        1.75,
    )

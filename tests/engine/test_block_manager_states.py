"""Random add / step / abort / finish / fork sequences against the scheduler and its block pool."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.core.sequence import FinishReason
from tests.engine.scheduler_factories import (
    FakeModel,
    add,
    live_seqs,
    make_prompt,
    make_scheduler,
    make_seq,
    step,
)

# shared prompt stems, so that random prompts hit (and evict) each other's cached blocks
STEMS = [make_prompt(24, seed) for seed in range(3)]
BLOCK_SIZE = 8


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a scheduler over a small pool, checking the pool's invariants after every rule."""

    @initialize(
        num_blocks=st.integers(5, 12),
        budget=st.sampled_from([8, 13, 32]),
        max_num_seqs=st.integers(1, 4),
        caching=st.booleans(),
    )
    def setup(self, num_blocks: int, budget: int, max_num_seqs: int, caching: bool) -> None:
        self.sched = make_scheduler(
            num_blocks,
            block_size=BLOCK_SIZE,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            max_model_len=64,
            enable_prefix_caching=caching,
        )
        self.model = FakeModel(num_blocks, BLOCK_SIZE)
        self.request_ids: list[str] = []

    @rule(
        stem=st.integers(0, len(STEMS) - 1),
        stem_len=st.integers(0, 24),
        suffix_len=st.integers(0, 8),
        max_tokens=st.integers(1, 8),
        n=st.integers(1, 3),
    )
    def add(self, stem: int, stem_len: int, suffix_len: int, max_tokens: int, n: int) -> None:
        seq_id = len(self.request_ids)
        prompt = STEMS[stem][:stem_len] + make_prompt(
            max(1, suffix_len) if stem_len == 0 else suffix_len, seq_id
        )
        seq = make_seq(seq_id, prompt, max_tokens=max_tokens, n=n)
        add(self.sched, seq)
        self.request_ids.append(seq.request_id)

    @precondition(lambda self: self.sched.has_unfinished())
    @rule()
    def step(self) -> None:
        preemptions = self.sched.num_preemptions
        out, _, _ = step(self.sched, self.model)
        assert self.sched.num_preemptions == preemptions + len(out.preempted)
        # forking may exceed max_num_seqs only for a request whose n alone exceeds it
        max_n = max((s.params.n for s in self.sched.running), default=1)
        assert len(self.sched.running) <= max(self.sched.config.max_num_seqs, max_n)

    @precondition(lambda self: self.request_ids)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(self.request_ids))
        live = self.sched.get_sequences(request_id)
        assert self.sched.abort(request_id) == live
        assert all(s.finish_reason is FinishReason.ABORT and not s.block_table for s in live)
        assert self.sched.get_sequences(request_id) == []

    @precondition(lambda self: self.sched.running)
    @rule(data=st.data())
    def finish_on_stop_string(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.sched.running))
        self.sched.finish(seq, FinishReason.STOP, stop_reason="###")
        assert seq not in self.sched.running and not seq.block_table

    @rule()
    def drain(self) -> None:
        for _ in range(500):
            if not self.sched.has_unfinished():
                return
            step(self.sched, self.model)
        raise AssertionError("sequences still unfinished after 500 steps")

    @invariant()
    def pool_is_consistent(self) -> None:
        if hasattr(self, "sched"):
            self.sched.block_manager.check_invariants(live_seqs(self.sched))

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        for request_id in self.request_ids:
            self.sched.abort(request_id)
        stats = self.sched.block_manager.stats()
        assert not self.sched.has_unfinished()
        assert stats.num_free_blocks + stats.num_cached_blocks == stats.num_blocks
        assert (stats.num_used_blocks, stats.num_shared_blocks) == (0, 0)
        self.sched.block_manager.check_invariants([])


SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestSchedulerStates = SchedulerMachine.TestCase

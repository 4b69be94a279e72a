"""Iteration-level continuous batching: chunked prefill, decode, preemption by recomputation, parallel samples."""

from __future__ import annotations

import time
from collections import deque

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.outputs import ScheduledSequence, SchedulerOutput
from engine.core.sequence import FinishReason, Sequence, SequenceStatus
from engine.core.stats import EngineStats, PoolSnapshot
from engine.core.utils import cdiv


def num_seq_slots_needed(seq: Sequence) -> int:
    """Running slots a waiting sequence will take: n for a request that has not forked its samples yet."""
    return seq.params.n if seq.num_output_tokens == 0 and seq.sample_index == 0 else 1


class Scheduler:
    """Decides each step which sequences run and how many tokens each computes; owns the block manager."""

    def __init__(self, config: EngineConfig, num_blocks: int, eos_token_ids: frozenset[int]) -> None:
        if config.max_model_len is None or config.max_num_batched_tokens is None:
            raise RuntimeError("Scheduler needs a resolved EngineConfig (EngineConfig.resolve)")
        self.config = config
        self.max_model_len: int = config.max_model_len
        self.max_num_batched_tokens: int = config.max_num_batched_tokens
        self.eos_token_ids = eos_token_ids
        self.block_manager = BlockManager(
            num_blocks, config.block_size, config.enable_prefix_caching, config.prefix_cache_salt.encode()
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.request_to_seqs: dict[str, list[Sequence]] = {}  # unfinished sequences only

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        """True while any sequence waits or runs."""
        return bool(self.waiting or self.running)

    def get_sequences(self, request_id: str) -> list[Sequence]:
        """The request's unfinished sequences (empty for unknown or finished requests)."""
        return list(self.request_to_seqs.get(request_id, ()))

    def add_sequence(self, seq: Sequence) -> None:
        """Queue a new sequence (FCFS). ValueError when even an empty pool could not hold it."""
        if seq.status is not SequenceStatus.WAITING or seq.block_table:
            raise RuntimeError(f"seq {seq.seq_id} is not a fresh waiting sequence")
        max_len = min(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len)
        # the final token is sampled but never stored, hence max_len - 1 slots
        num_blocks_needed = cdiv(max_len - 1, self.config.block_size)
        if num_blocks_needed > self.block_manager.num_blocks:
            raise ValueError(
                f"prompt + max_tokens ({max_len} tokens) needs {num_blocks_needed} KV blocks, "
                f"the pool has {self.block_manager.num_blocks}"
            )
        self.waiting.append(seq)
        self.request_to_seqs.setdefault(seq.request_id, []).append(seq)

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every unfinished sequence of the request with ABORT and free its blocks."""
        seqs = self.get_sequences(request_id)
        for seq in seqs:
            self.finish(seq, FinishReason.ABORT)
        return seqs

    def finish(self, seq: Sequence, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        """Mark the sequence finished, free its blocks and drop it from the queues."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        siblings = self.request_to_seqs[seq.request_id]
        siblings.remove(seq)
        if not siblings:
            del self.request_to_seqs[seq.request_id]

    def schedule(self) -> SchedulerOutput:
        """Pick this step's work: running sequences oldest first, then FCFS admissions if nothing was preempted."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(len(seq) - seq.num_computed_tokens, budget)
            assert num_new > 0, f"running seq {seq.seq_id} has no token to compute"
            copies = self.block_manager.allocate_slots(seq, num_new)
            while copies is None:
                victim = self.running[-1]  # never one already scheduled: those sit before index i
                self._preempt(victim, out)
                if victim is seq:
                    break
                copies = self.block_manager.allocate_slots(seq, num_new)
            if copies is None:
                break
            out.scheduled.append(ScheduledSequence(seq, num_new))
            out.block_copies.extend(copies)
            budget -= num_new
            i += 1
        if out.preempted:
            return out

        max_num_seqs = self.config.max_num_seqs
        num_seq_slots = sum(num_seq_slots_needed(s) for s in self.running)  # samples not forked yet count too
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            needed = min(num_seq_slots_needed(seq), max_num_seqs)
            if num_seq_slots + needed > max_num_seqs:
                break
            cached_block_ids = self.block_manager.match_prefix(seq)
            num_new = min(len(seq) - len(cached_block_ids) * self.config.block_size, budget)
            copies = self.block_manager.allocate_slots(seq, num_new, cached_block_ids)
            if copies is None:
                break  # head-of-line: later requests do not overtake this one
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            out.block_copies.extend(copies)
            budget -= num_new
            num_seq_slots += needed
        return out

    def update(
        self, output: SchedulerOutput, sampled: dict[int, int], now: float | None = None
    ) -> list[Sequence]:
        """Advance progress, append sampled tokens, finish stopped sequences; returns those that got a token."""
        now = time.monotonic() if now is None else now
        got_token: list[Sequence] = []
        for scheduled in output.scheduled:
            seq = scheduled.seq
            if seq.is_finished:
                continue
            samples = scheduled.samples
            seq.num_computed_tokens += scheduled.num_new_tokens
            self.block_manager.cache_full_blocks(seq)  # before a finish frees them, so they stay cached
            if not samples:
                continue
            if seq.seq_id not in sampled:
                raise RuntimeError(f"seq {seq.seq_id} reached its last token but no sample was given")
            seq.token_ids.append(sampled[seq.seq_id])
            if seq.first_token_time is None:
                seq.first_token_time = now
            self.check_stop(seq)
            got_token.append(seq)
        return got_token

    def check_stop(self, seq: Sequence) -> bool:
        """Finish the sequence if its last token ends it (EOS, a stop token, max_tokens, max_model_len)."""
        token_id = seq.token_ids[-1]
        if not seq.params.ignore_eos and token_id in self.eos_token_ids:
            self.finish(seq, FinishReason.STOP)
        elif token_id in seq.params.stop_token_ids:
            self.finish(seq, FinishReason.STOP, stop_reason=token_id)
        elif seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            self.finish(seq, FinishReason.LENGTH)
        return seq.is_finished

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Start a parallel sample sharing all of the parent's blocks, the partial tail included.

        Either right after update() gave the parent its first token (the child then holds its own first token and
        is checked for a stop at once), or between schedule() and update() with the child's token ids equal to
        the parent's: the caller then adds ScheduledSequence(child, same num_new_tokens) to the output, and
        update() gives the child its first token.
        """
        if child.status is not SequenceStatus.WAITING or child.block_table:
            raise RuntimeError(f"fork target seq {child.seq_id} is not a fresh sequence")
        self.request_to_seqs.setdefault(child.request_id, []).append(child)
        if parent.is_finished:
            # the parent's blocks are already freed (cached ones stay findable): recompute through admission
            child.num_computed_tokens = 0
            self.waiting.appendleft(child)
        else:
            child.num_computed_tokens = parent.num_computed_tokens
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            pos = self.running.index(parent) + 1
            while pos < len(self.running) and self.running[pos].request_id == parent.request_id:
                pos += 1  # keep siblings in sample order
            self.running.insert(pos, child)
        if child.num_output_tokens:
            self.check_stop(child)

    def stats(
        self, num_prompt_tokens_total: int = 0, num_generation_tokens_total: int = 0, num_steps: int = 0
    ) -> EngineStats:
        """Pool and queue statistics; the engine passes its own token and step counters."""
        pool = self.block_manager.stats()
        return EngineStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preemptions=self.num_preemptions,
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free_blocks,
            num_cached_blocks=pool.num_cached_blocks,
            num_used_blocks=pool.num_used_blocks,
            num_shared_blocks=pool.num_shared_blocks,
            num_tokens_stored=sum(s.num_computed_tokens for s in self.running),
            num_slots_allocated=sum(self.block_manager.num_slots_allocated(s) for s in self.running),
            prefix_query_tokens=pool.prefix_query_tokens,
            prefix_hit_tokens=pool.prefix_hit_tokens,
            num_prompt_tokens_total=num_prompt_tokens_total,
            num_generation_tokens_total=num_generation_tokens_total,
            num_steps=num_steps,
            block_size=self.config.block_size,
            max_model_len=self.max_model_len,
        )

    def snapshot(self, **engine_counters: int) -> PoolSnapshot:
        """A consistent picture of the pool and the live sequences (call on the engine thread)."""
        states, ref_counts, hash_prefixes = self.block_manager.snapshot()
        sequences = [
            {
                "seq_id": s.seq_id,
                "request_id": s.request_id,
                "block_table": list(s.block_table),
                "num_tokens": len(s),
                "num_computed_tokens": s.num_computed_tokens,
                "status": s.status.value,
            }
            for s in [*self.running, *self.waiting]
        ]
        return PoolSnapshot(states, ref_counts, hash_prefixes, sequences, self.stats(**engine_counters))

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        # recompute later: its full blocks stay in the prefix cache, so resuming is usually cheap
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

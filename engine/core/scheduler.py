"""Iteration-level continuous batching: chunked prefill, decode, preemption by recomputation, parallel samples."""

from __future__ import annotations

import itertools
import time
from collections import deque

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.hash_chain import num_cacheable_blocks, pool_hash_salt
from engine.core.outputs import ScheduledSequence, SchedulerOutput
from engine.core.sequence import FinishReason, Sequence, SequenceStatus
from engine.core.speculative import SpecPlanner
from engine.core.stats import CacheDigest, EngineStats, PoolSnapshot
from engine.core.tier import KVTier, LoadJob
from engine.core.utils import cdiv


def num_seq_slots_needed(seq: Sequence) -> int:
    """Running slots a waiting sequence will take: n for a request that has not forked its samples yet."""
    return seq.params.n if seq.num_output_tokens == 0 and seq.sample_index == 0 else 1


class Scheduler:
    """Decides each step which sequences run and how many tokens each computes; owns the block manager.

    The only writer of a sequence's status and finish reason. A request of n > 1 samples comes as its first sample
    plus n - 1 fresh sequences: the step that computes the prompt's last token forks them (they share every block,
    copy-on-write), and each samples its own first token from the prompt's logits in that same step.
    """

    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        eos_token_ids: frozenset[int],
        *,
        kv_cache_dtype: str = "",
        kv_block_bytes: int = 0,
        tier: KVTier | None = None,
        spec: SpecPlanner | None = None,
    ) -> None:
        """kv_cache_dtype / kv_block_bytes: what the runner's pool stores and a block's bytes, reported in stats.

        `spec`: speculative decoding's planner; with it a decode step's sequences may verify proposed tokens.

        `tier`: a lower KV tier (the disk). Cached blocks are offered to it when their sequence frees them; an
        admission whose prefix continues past the RAM hits into the tier waits LOADING, off the queues, while the
        tier reads those blocks into pool blocks it holds, then re-enters the waiting queue at its head.
        """
        if config.max_model_len is None or config.max_num_batched_tokens is None:
            raise RuntimeError("Scheduler needs a resolved EngineConfig (engine/core/resolve.py)")
        self.config = config
        self.kv_cache_dtype, self.kv_block_bytes = kv_cache_dtype, kv_block_bytes
        self.max_model_len: int = config.max_model_len
        self.max_num_batched_tokens: int = config.max_num_batched_tokens
        self.eos_token_ids = eos_token_ids
        self.block_manager = BlockManager(
            num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            pool_hash_salt(config.prefix_cache_salt),
            copy_partial_blocks=config.copy_partial_blocks,
        )
        self.tier = tier if config.enable_prefix_caching else None
        self.spec = spec
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # seq_id -> its load, in flight or not started yet (a finished seq's too, cancelled)
        self.loading: dict[int, LoadJob] = {}
        # loads not handed to the tier yet: they fill a block this step copies from (see _start_loads)
        self._unstarted_loads: list[LoadJob] = []
        self.num_disk_hit_tokens = 0
        self.request_to_seqs: dict[str, list[Sequence]] = {}  # unfinished sequences in the queues
        self.unforked: dict[int, list[Sequence]] = {}  # first sample's seq_id -> the samples it forks later
        self.num_preemptions = 0
        self.num_steps = 0
        # prompt tokens of requests that got their first token, cached or not, once per request (vLLM's meaning)
        self.num_prompt_tokens_total = 0
        self.num_computed_prompt_tokens_total = (
            0  # prompt tokens run through the model, recomputation included
        )
        self.num_generation_tokens_total = 0
        self._finished_seq_ids: list[int] = []  # finished since the last schedule(), reported by the next

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        """True while any sequence waits, loads or runs."""
        return bool(self.waiting or self.running or self.loading)

    def get_sequences(self, request_id: str) -> list[Sequence]:
        """The request's unfinished sequences in the queues (empty for unknown or finished requests)."""
        return list(self.request_to_seqs.get(request_id, ()))

    def add_sequence(self, seq: Sequence, forks: list[Sequence] | None = None) -> None:
        """Queue a request's first sample (FCFS) and the n - 1 `forks` it starts once its prompt is computed.

        ValueError when even an empty pool could not hold it.
        """
        forks = forks or []
        for s in (seq, *forks):
            if s.status is not SequenceStatus.WAITING or s.block_table:
                raise RuntimeError(f"seq {s.seq_id} is not a fresh waiting sequence")
        if len(forks) != seq.params.n - 1 or any(
            f.request_id != seq.request_id or f.token_ids != seq.token_ids for f in forks
        ):
            raise RuntimeError(
                f"request {seq.request_id!r} with n={seq.params.n} needs {seq.params.n - 1} sequences to fork "
                f"with its prompt, got {len(forks)}"
            )
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
        if forks:
            self.unforked[seq.seq_id] = list(forks)

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> list[Sequence]:
        """Finish every unfinished sequence of the request (ABORT, or ERROR for a failed one); free its blocks."""
        seqs = self.get_sequences(request_id)
        for seq in seqs:
            self.finish(seq, reason)
        return seqs

    def finish(self, seq: Sequence, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        """Mark the sequence finished, free its blocks and drop it from the queues, with any samples it had yet to
        fork (those can no longer start)."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.LOADING:
            # its blocks are released when the loader is done with them
            self.loading[seq.seq_id].cancelled = True
        else:
            self.waiting.remove(seq)
        self._free(seq)
        siblings = self.request_to_seqs[seq.request_id]
        siblings.remove(seq)
        if not siblings:
            del self.request_to_seqs[seq.request_id]
        if self.spec is not None:
            self.spec.forget(seq.seq_id)
        for s in (seq, *self.unforked.pop(seq.seq_id, ())):
            s.status = SequenceStatus.FINISHED
            s.finish_reason, s.stop_reason = reason, stop_reason
            self._finished_seq_ids.append(s.seq_id)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's work: running sequences oldest first, then FCFS admissions if nothing was preempted;
        then fork the other samples of each request whose prompt completes in this step."""
        self._start_loads()  # the last step's copies have run, or it failed
        if self.loading:
            self._finish_loads()
        out = SchedulerOutput(finished_seq_ids=self._finished_seq_ids)
        self._finished_seq_ids = []
        budget = self._schedule_running(out)
        if not out.preempted:
            self._admit_waiting(out, budget)
        if self.unforked:
            self._fork_samples(out)
        if self.spec is not None:
            self.spec.proposing_seconds = 0.0
            if not out.forked:  # a forking step samples its forks from their first sample's row
                self._propose(out)
        self._start_loads(out.block_copies)
        if out.scheduled:
            self.num_steps += 1
            self.num_computed_prompt_tokens_total += sum(
                s.num_new_tokens for s in out.scheduled if s.seq.num_computed_tokens < s.seq.num_prompt_tokens
            )
        return out

    def _schedule_running(self, out: SchedulerOutput) -> int:
        """Give each running sequence, oldest first, its next tokens, preempting the youngest when the pool is
        full; returns the token budget left."""
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
        return budget

    def _propose(self, out: SchedulerOutput) -> None:
        """Give a decode step's sequences the proposed tokens the planner picks, where the pool has their slots: only
        in steps of one new token per sequence past its prompt (a step with a prompt chunk has rows enough), so that
        a sequence's rows take the same kernels as without speculation. Never preempts for them."""
        if not out.is_decode:
            return
        assert self.spec is not None
        items = out.scheduled
        # proposed tokens are batched tokens like any others: within the step's token budget
        max_rows = len(items) + self.max_num_batched_tokens - out.num_batched_tokens
        plans = self.spec.plan([item.seq for item in items], self.max_model_len, max_rows)
        for item, tokens in zip(items, plans, strict=True):
            if not tokens:
                continue
            copies = self.block_manager.allocate_slots(
                item.seq, 1 + len(tokens), num_lookahead_tokens=len(tokens)
            )
            if copies is None:
                continue
            out.block_copies.extend(copies)
            item.spec_token_ids = tokens

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """Admit waiting sequences in FCFS order while the budget, the slots and the pool allow."""
        max_num_seqs = self.config.max_num_seqs
        num_seq_slots = sum(num_seq_slots_needed(s) for s in self.running)  # samples not forked yet count too
        num_seq_slots += sum(num_seq_slots_needed(j.seq) for j in self.loading.values() if not j.cancelled)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            needed = min(num_seq_slots_needed(seq), max_num_seqs)
            if num_seq_slots + needed > max_num_seqs:
                break
            cached_block_ids = self._prefix_hits(seq)
            if (
                self.tier is not None
                and not seq.pinned_block_ids
                and not seq.needs_prompt_logprobs
                and self._start_load(seq, cached_block_ids)
            ):
                self.waiting.popleft()
                num_seq_slots += needed  # it runs once loaded: loads never exceed max_num_seqs
                continue
            num_new, copies = self._allocate_admitted(seq, cached_block_ids, budget)
            if copies is None and self._unpin_others(seq):  # loaded blocks others hold may be what it lacks
                num_new, copies = self._allocate_admitted(seq, self._prefix_hits(seq), budget)
            if copies is None:
                break  # head-of-line: later requests do not overtake this one
            self.waiting.popleft()
            if seq.pinned_block_ids:  # now referenced by its block table
                # with prefix_hit_tokens, which admission counts: ram hits (their difference) never go down
                self.num_disk_hit_tokens += seq.num_disk_cached_tokens
                self._unpin(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            out.block_copies.extend(copies)
            budget -= num_new
            num_seq_slots += needed

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """The cached blocks its admission reuses; none for a request that wants its prompt's logprobs, which
        only a forward over the whole prompt gives (its blocks are still hashed and shared once computed)."""
        return [] if seq.needs_prompt_logprobs else self.block_manager.match_prefix(seq)

    def _allocate_admitted(
        self, seq: Sequence, cached_block_ids: list[int], budget: int
    ) -> tuple[int, list[tuple[int, int]] | None]:
        """Admit the sequence on its cached blocks, and a copy of the block it forks inside if one is cached: the
        tokens it computes this step, and the block copies (None: no room)."""
        partial = (
            None
            if seq.needs_prompt_logprobs
            else self.block_manager.match_partial(seq, len(cached_block_ids))
        )
        num_cached = len(cached_block_ids) * self.config.block_size + (partial[1] if partial else 0)
        num_new = min(len(seq) - num_cached, budget)
        return num_new, self.block_manager.allocate_slots(seq, num_new, cached_block_ids, partial)

    def _start_load(self, seq: Sequence, cached_block_ids: list[int]) -> bool:
        """Send the sequence LOADING if the tier holds blocks right after its RAM hits and the pool has room."""
        bm = self.block_manager
        start, end = len(cached_block_ids), num_cacheable_blocks(len(seq), self.config.block_size)
        if start >= end:
            return False
        assert self.tier is not None
        hashes = bm.chain_hashes(seq, start, end)
        num_held = self.tier.lookup(hashes)
        if num_held == 0:
            return False
        block_ids = bm.reserve(num_held, cached_block_ids)
        if block_ids is None:
            return False
        job = LoadJob(seq, hashes[:num_held], block_ids, list(cached_block_ids))
        seq.status = SequenceStatus.LOADING
        self.loading[seq.seq_id] = job
        self._unstarted_loads.append(job)
        return True

    def _start_loads(self, copies: list[tuple[int, int]] | None = None) -> None:
        """Hand loads picked so far to the tier, but those that fill the source of one of `copies`. A load writes
        into its blocks from the tier's thread as soon as it starts, and the blocks it took may include the source
        of one of this step's copies (a partial block's match is free, only cached): such a load starts once the
        step's copies have run (update, or the next schedule() after a failed step)."""
        if not self._unstarted_loads:
            return
        assert self.tier is not None
        copy_sources = {src for src, _ in copies} if copies else set()
        jobs, self._unstarted_loads = self._unstarted_loads, []
        for job in jobs:
            if copy_sources.isdisjoint(job.block_ids):
                self.tier.load(job)
            else:
                self._unstarted_loads.append(job)

    def _finish_loads(self) -> None:
        """Take the tier's finished loads: loaded blocks join the prefix cache; their sequences wait again, first."""
        assert self.tier is not None
        bm = self.block_manager
        for job in self.tier.take_completed():
            del self.loading[job.seq.seq_id]
            loaded = job.block_ids[: job.num_loaded]
            start = len(job.pinned_block_ids)  # the loaded blocks' place in the chain: after the RAM hits
            tags = bm.hasher.salt_tags(job.seq.chain_key, start, start + len(loaded))
            for block_id, block_hash, tag in zip(loaded, job.block_hashes, tags, strict=False):
                bm.register(block_id, block_hash, tag)
            bm.release(job.block_ids[job.num_loaded :])  # never filled: back to the free queue's head
            seq = job.seq
            if job.cancelled or seq.is_finished:
                bm.release(job.pinned_block_ids + loaded)
                continue
            seq.pinned_block_ids = job.pinned_block_ids + loaded
            seq.num_disk_cached_tokens = len(loaded) * self.config.block_size  # counted when it is admitted
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def _unpin_others(self, head: Sequence) -> bool:
        """Release the pins of every waiting sequence but `head` (their blocks stay cached in RAM and on disk, to be
        matched or loaded again); True if any were held. Without this, pins behind a head that cannot be admitted
        could keep it from ever being admitted."""
        released = False
        for seq in self.waiting:
            if seq is not head and seq.pinned_block_ids:
                self._unpin(seq)
                seq.num_disk_cached_tokens = 0  # its blocks are RAM hits now, if still cached
                released = True
        return released

    def held_block_ids(self) -> list[int]:
        """Blocks referenced outside block tables: pins of waiting sequences and the blocks of loads in flight."""
        held = [b for s in self.waiting for b in s.pinned_block_ids]
        for job in self.loading.values():
            held += job.pinned_block_ids + job.block_ids
        return held

    def _free(self, seq: Sequence) -> None:
        """Offer the sequence's cached blocks to the tier, then drop its references (table and pins)."""
        if self.tier is not None and seq.num_hashed_blocks:
            tags = self.block_manager.hasher.salt_tags(seq.chain_key, 0, seq.num_hashed_blocks)
            for block_id, block_hash, tag in zip(seq.block_table, seq.block_hashes, tags, strict=False):
                self.tier.offer(block_id, block_hash, tag)
        self.block_manager.free(seq)
        self._unpin(seq)

    def _unpin(self, seq: Sequence) -> None:
        """Drop the references a waiting sequence holds on its loaded prefix (pins)."""
        self.block_manager.release(seq.pinned_block_ids)
        seq.pinned_block_ids = []

    def _fork_samples(self, out: SchedulerOutput) -> None:
        """Start the other samples of each request whose prompt completes in this step: each shares every block,
        joins the running queue after its first sample and is listed in out.forked to sample its first token."""
        for item in out.scheduled:
            forks = self.unforked.pop(item.seq.seq_id, None) if item.samples else None
            if forks is None:
                continue
            parent = item.seq
            pos = self.running.index(parent) + 1  # siblings run right after it, in sample order
            for child in forks:
                self.block_manager.fork(parent, child)
                child.num_computed_tokens = parent.num_computed_tokens
                child.status = SequenceStatus.RUNNING
                self.running.insert(pos, child)
                pos += 1
                self.request_to_seqs[child.request_id].append(child)
                out.forked.append(ScheduledSequence(child, item.num_new_tokens))

    def update(
        self,
        output: SchedulerOutput,
        sampled: dict[int, int],
        now: float | None = None,
        accepted: dict[int, list[int]] | None = None,
    ) -> list[Sequence]:
        """Advance progress, append sampled tokens, finish stopped sequences; returns those that got a token.

        `accepted`: seq_id -> the proposed tokens it kept, which come before its sampled token; the KV of the rest is
        dropped (its progress stops after the last kept one, and its blocks past that go back to the pool)."""
        self._start_loads()  # the model has run the step's copies
        now = time.monotonic() if now is None else now
        got_token: list[Sequence] = []
        num_tokens = 0
        for scheduled in itertools.chain(output.scheduled, output.forked):
            seq = scheduled.seq
            seq.num_new_tokens = 0
            if seq.is_finished:
                continue
            samples = scheduled.samples
            spec = scheduled.spec_token_ids
            kept = accepted.get(seq.seq_id, []) if accepted and spec else []
            if samples and seq.seq_id not in sampled:
                raise RuntimeError(f"seq {seq.seq_id} reached its last token but no sample was given")
            stop = None
            if samples:
                assert kept == list(spec[: len(kept)]), f"seq {seq.seq_id} kept tokens it was not proposed"
                for token_id in (*kept, sampled[seq.seq_id]):  # one at a time: a stop cuts the rest
                    seq.token_ids.append(token_id)
                    seq.num_new_tokens += 1
                    stop = self._stop(seq)
                    if stop is not None:
                        break
            # the KV of the new tokens and of the kept proposed ones is valid, that of the rejected ones is not
            seq.num_computed_tokens += scheduled.num_new_tokens + min(len(kept), seq.num_new_tokens)
            if spec:
                self.block_manager.trim(seq)
                seq.num_draft_tokens += len(spec)
                seq.num_accepted_tokens += len(kept)
                if self.spec is not None:
                    self.spec.record(seq.seq_id, len(spec), len(kept))
            self.block_manager.cache_full_blocks(seq)  # before a finish frees them, so they stay cached
            if not samples:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = now
                if seq.sample_index == 0:
                    self.num_prompt_tokens_total += seq.num_prompt_tokens
            seq.last_token_time = now
            if stop is not None:
                self.finish(seq, *stop)
            got_token.append(seq)
            num_tokens += seq.num_new_tokens
        if output.num_spec_tokens and self.spec is not None:
            self.spec.counters.num_steps += 1
        self.num_generation_tokens_total += num_tokens
        return got_token

    def _stop(self, seq: Sequence) -> tuple[FinishReason, int | None] | None:
        """Why the sequence's last token ends it, if it does: (finish reason, stop token)."""
        token_id = seq.token_ids[-1]
        if not seq.params.ignore_eos and token_id in self.eos_token_ids:
            return FinishReason.STOP, None
        if token_id in seq.params.stop_token_ids:
            return FinishReason.STOP, token_id
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq) >= self.max_model_len:
            return FinishReason.LENGTH, None
        return None

    def stats(self) -> EngineStats:
        """Pool and queue gauges, and the step and token counters since start."""
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
            num_prompt_tokens_total=self.num_prompt_tokens_total,
            num_computed_prompt_tokens_total=self.num_computed_prompt_tokens_total,
            num_generation_tokens_total=self.num_generation_tokens_total,
            num_steps=self.num_steps,
            block_size=self.config.block_size,
            max_model_len=self.max_model_len,
            kv_cache_dtype=self.kv_cache_dtype,
            kv_block_bytes=self.kv_block_bytes,
            num_loading=sum(not job.cancelled for job in self.loading.values()),
            disk_hit_tokens=self.num_disk_hit_tokens,
            tier=self.tier.stats() if self.tier is not None else None,
            spec=self.spec.stats(self.config.speculative_method) if self.spec is not None else None,
        )

    def cache_digest(self) -> CacheDigest:
        """The prefix cache's block hashes and the load a replica router weighs them against (see CacheDigest)."""
        bm = self.block_manager
        return CacheDigest(
            hash_prefixes=bm.cached_hash_prefixes(),
            num_running=len(self.running),
            num_waiting=len(self.waiting) + sum(not job.cancelled for job in self.loading.values()),
            num_free_blocks=len(bm.free_queue),
            num_blocks=bm.num_blocks,
            max_num_seqs=self.config.max_num_seqs,
            block_size=bm.block_size,
        )

    def snapshot(self, hash_block_ids: range | None = None) -> PoolSnapshot:
        """A consistent picture of the pool and the live sequences (call on the engine thread); block hashes of
        `hash_block_ids` only, when given."""
        states, ref_counts, hash_prefixes = self.block_manager.snapshot(hash_block_ids)
        sequences = [
            {
                "seq_id": s.seq_id,
                "request_id": s.request_id,
                "block_table": list(s.block_table),
                "num_tokens": len(s),
                "num_computed_tokens": s.num_computed_tokens,
                "num_prompt_tokens": s.num_prompt_tokens,
                "num_cached_tokens": s.num_cached_tokens,  # its prefix-cache hit at the last admission
                "status": s.status.value,
            }
            for s in [
                *self.running,
                *self.waiting,
                *(j.seq for j in self.loading.values() if not j.cancelled),
            ]
        ]
        return PoolSnapshot(states, ref_counts, hash_prefixes, sequences, self.stats())

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        # recompute later: its full blocks stay in the prefix cache, so resuming is usually cheap
        self.running.remove(seq)
        self._free(seq)
        if self.spec is not None:
            self.spec.release(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

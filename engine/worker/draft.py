"""`--speculative-method draft`: proposals from a smaller model that shares the target's tokenizer.

The draft keeps, for each sequence it proposes for, a mirror Sequence over its own paged KV pool (its own block
manager, prefix-cached like the target's and keyed by the same tenant salt), and runs its own ModelRunner (the fused
CPU step where the model allows). Before each proposal the mirror takes the target's tokens: what the target
rejected is rolled back (progress moved back, blocks past it given back; only verified tokens are ever hashed), what
it has not computed yet (the target's own token, or the whole context of a sequence it has not seen) is computed,
and then it decodes greedily, one token a round, for as many tokens as the planner asks (SpecPlanner). A greedy
draft is a deterministic proposer: the target's verification (Sampler.verify) keeps the output distribution.
"""

from __future__ import annotations

import time

from engine.core.block_manager import BlockManager
from engine.core.hash_chain import pool_hash_salt
from engine.core.ngram import Proposal
from engine.core.outputs import ScheduledSequence, SchedulerOutput
from engine.core.sequence import SamplingParams, Sequence, SequenceStatus
from engine.worker.model_runner import ModelRunner

DRAFT_PARAMS = SamplingParams(temperature=0.0, max_tokens=2**30, ignore_eos=True)


class DraftProposer:
    """A draft model's proposals for the target's decode steps (see the module docstring)."""

    free = False  # proposing costs the draft's forward passes: the planner asks for its tokens' count first

    def __init__(
        self,
        runner: ModelRunner,
        num_blocks: int,
        block_size: int,
        max_chunk: int,
        salt: str,
        vocab_size: int,
    ) -> None:
        self.runner = runner
        self.vocab_size = vocab_size  # the target's: a padded draft head's ids past it end a proposal
        self.block_manager = BlockManager(
            num_blocks, block_size, True, pool_hash_salt(salt), copy_partial_blocks=False
        )
        self.max_chunk = max_chunk  # context tokens a round may compute for one sequence it catches up
        self.mirrors: dict[int, Sequence] = {}
        self.seconds_per_round: float | None = None  # a decode round's time, measured

    def propose(self, seq: Sequence, k: int) -> Proposal:
        """Unused: a draft's tokens are asked for all at once (`generate`)."""
        raise NotImplementedError("DraftProposer proposes through generate()")

    def generate(self, seqs: list[Sequence], ks: list[int]) -> list[tuple[int, ...]]:
        """Up to ks[i] greedy draft tokens to follow seqs[i] (fewer, or none, where the draft's pool has no room or
        the sequence's context is not caught up yet)."""
        tokens: dict[int, list[int]] = {seq.seq_id: [] for seq in seqs}
        want = {seq.seq_id: k for seq, k in zip(seqs, ks, strict=True)}
        active = [m for seq, k in zip(seqs, ks, strict=True) if k > 0 and (m := self._sync(seq)) is not None]
        decode_rounds, decode_seconds = 0, 0.0
        while active:
            started = time.perf_counter()
            out = SchedulerOutput()
            for mirror in active:
                num_new = min(len(mirror) - mirror.num_computed_tokens, self.max_chunk)
                assert num_new >= 1, f"draft mirror {mirror.seq_id} has no token to compute"
                copies = self.block_manager.allocate_slots(mirror, num_new)
                if copies is None:  # the draft's pool is full: this sequence gets what it has so far
                    continue
                out.scheduled.append(ScheduledSequence(mirror, num_new))
                out.block_copies.extend(copies)
            if not out.scheduled:
                break
            result = self.runner.execute(out)
            # a decode round (catching up a context is not)
            if out.num_batched_tokens <= 2 * len(out.scheduled):
                decode_rounds += 1
                decode_seconds += time.perf_counter() - started
            sampled = result.seq_id_to_token_id()
            active = []
            for item in out.scheduled:
                mirror = item.seq
                mirror.num_computed_tokens += item.num_new_tokens
                if mirror.seq_id not in sampled:  # a context chunk: no token yet, and none this step
                    continue
                token = sampled[mirror.seq_id]
                if token >= self.vocab_size:  # not a token of the target's: the proposal ends before it
                    continue
                mirror.token_ids.append(token)
                got = tokens[mirror.seq_id]
                got.append(token)
                if len(got) < want[mirror.seq_id]:
                    active.append(mirror)
        if decode_rounds:
            elapsed = decode_seconds / decode_rounds
            old = self.seconds_per_round
            self.seconds_per_round = elapsed if old is None else 0.9 * old + 0.1 * elapsed
        return [tuple(tokens[seq.seq_id]) for seq in seqs]

    def _sync(self, seq: Sequence) -> Sequence | None:
        """The sequence's mirror holding exactly its tokens: rejected draft tokens rolled back, verified blocks
        hashed; None when the draft's pool cannot take a new mirror."""
        mirror = self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = Sequence(
                seq.seq_id, seq.request_id, list(seq.token_ids), seq.num_prompt_tokens, DRAFT_PARAMS, 0.0,
                chain_key=seq.chain_key,
            )  # fmt: skip
            cached = self.block_manager.match_prefix(mirror)
            if self.block_manager.allocate_slots(mirror, 0, cached) is None:
                return None
            mirror.status = SequenceStatus.RUNNING
            self.mirrors[seq.seq_id] = mirror
            return mirror
        common = 0
        for mine, theirs in zip(mirror.token_ids, seq.token_ids, strict=False):
            if mine != theirs:
                break
            common += 1
        mirror.token_ids = list(seq.token_ids)
        # at least the last token is left to compute: it gives the logits of the first draft token (the target may
        # have taken, unverified, the very tokens the draft computed last time)
        mirror.num_computed_tokens = min(mirror.num_computed_tokens, common, len(seq) - 1)
        self.block_manager.trim(mirror)
        self.block_manager.cache_full_blocks(mirror)
        return mirror

    def forget(self, seq_id: int) -> None:
        """The sequence finished or was preempted: its mirror's blocks go back (cached where verified)."""
        mirror = self.mirrors.pop(seq_id, None)
        if mirror is not None:
            self.block_manager.free(mirror)

"""Factories for scheduler tests: tiny configs, sequences, a fake model that decodes deterministically, steps."""

from __future__ import annotations

from engine.core.config import EngineConfig
from engine.core.outputs import SchedulerOutput
from engine.core.scheduler import Scheduler
from engine.core.sequence import SamplingParams, Sequence

EOS = 2


def make_scheduler(num_blocks: int = 64, **overrides: object) -> Scheduler:
    kwargs = {"block_size": 8, "max_num_batched_tokens": 64, "max_model_len": 512, "max_num_seqs": 8}
    kwargs.update(overrides)
    return Scheduler(EngineConfig(**kwargs), num_blocks, frozenset({EOS}))  # type: ignore[arg-type]


def make_seq(seq_id: int, prompt: list[int], **params: object) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(prompt), len(prompt), SamplingParams(**params), 0.0)  # type: ignore[arg-type]


def make_prompt(length: int, seed: int = 0) -> list[int]:
    return [10 + (i * 7919 + seed * 104729) % 5000 for i in range(length)]


def next_token(context: list[int]) -> int:
    """A deterministic stand-in for a greedy model: depends on every previous token, never EOS."""
    return 10 + sum(t * (i + 1) for i, t in enumerate(context)) % 997


class FakeModel:
    """Writes each computed token into a simulated KV pool and samples from the context read back from it.

    Reading the context through the block table catches any block sharing, copy or prefix-hit error.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]

    def __call__(self, out: SchedulerOutput) -> dict[int, int]:
        bs = self.block_size
        for src, dst in out.block_copies:
            self.kv[dst] = list(self.kv[src])
        for s in out.scheduled:
            seq = s.seq
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + s.num_new_tokens):
                self.kv[seq.block_table[pos // bs]][pos % bs] = seq.token_ids[pos]
        sampled = {}
        for s in out.scheduled:
            if s.samples:
                seq = s.seq
                context = [self.kv[seq.block_table[pos // bs]][pos % bs] for pos in range(len(seq))]
                assert context == seq.token_ids, f"seq {seq.seq_id} reads a corrupted context"
                sampled[seq.seq_id] = next_token(context)  # type: ignore[arg-type]
        return sampled


def make_child(parent: Sequence, k: int) -> Sequence:
    seq_id = 10_000 + parent.seq_id * 100 + k  # apart from the tests' own ids
    return Sequence(
        seq_id, parent.request_id, list(parent.token_ids), parent.num_prompt_tokens, parent.params, 0.0, k
    )


def add(sched: Scheduler, seq: Sequence) -> list[Sequence]:
    """Queue a request as the engine does: its first sample, and for n > 1 the samples it forks later."""
    forks = [make_child(seq, k) for k in range(1, seq.params.n)]
    sched.add_sequence(seq, forks)
    return forks


def live_seqs(sched: Scheduler) -> list[Sequence]:
    return [*sched.running, *sched.waiting]


def step(
    sched: Scheduler, model: FakeModel
) -> tuple[SchedulerOutput, list[tuple[int, int, bool]], list[Sequence]]:
    """One engine step; returns the output, its (seq_id, num_new_tokens, samples) and the sequences given a token."""
    running_before = list(sched.running)
    out = sched.schedule()
    assert not out.is_empty, "nothing scheduled although sequences are unfinished"
    assert out.num_batched_tokens <= sched.max_num_batched_tokens
    if out.preempted:  # no admission in a step that preempts; the preempted go back first, oldest first
        assert all(s.seq in running_before for s in out.scheduled)
        assert list(sched.waiting)[: len(out.preempted)] == out.preempted[::-1]
    # samples is read before update moves num_computed_tokens
    scheduled = [(s.seq.seq_id, s.num_new_tokens, s.samples) for s in out.scheduled]
    sampled = model(out)
    seqs, rows = out.sampling_rows()
    assert list(sampled) == [seq.seq_id for seq in seqs[: len(sampled)]]
    for seq, row in zip(seqs[len(sampled) :], rows[len(sampled) :], strict=True):
        # a sample forked this step draws its own first token from its first sample's row
        sampled[seq.seq_id] = sampled[seqs[row].seq_id] + 1000 * seq.sample_index
    got_token = sched.update(out, sampled)
    sched.block_manager.check_invariants(live_seqs(sched), sched.held_block_ids())
    return out, scheduled, got_token


def run_to_completion(sched: Scheduler, model: FakeModel | None = None) -> list[SchedulerOutput]:
    model = model or FakeModel(sched.block_manager.num_blocks, sched.config.block_size)
    outputs = []
    while sched.has_unfinished():
        assert len(outputs) < 2000, "no progress"
        outputs.append(step(sched, model)[0])
    assert sched.block_manager.stats().num_used_blocks == 0
    return outputs

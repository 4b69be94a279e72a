"""The scheduler over a real disk tier: blocks offered at free, the chain continuing from RAM into disk while the
sequence waits LOADING, tenants' chains kept apart, and random add/step/abort/corrupt/restart runs with a loader
faster and one slower than the model's step (TimedTier: a run is then the same run every time, as hypothesis needs).

The fake model keeps its "KV" in a torch pool tensor (each slot holds its token id, K and V), the very tensor the
tier stages from and loads into, and reads every context back from it: a block served from disk that differs from
what was written shows up as a corrupted context.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.core.config import EngineConfig
from engine.core.hash_chain import NO_SALT, ChainKey
from engine.core.outputs import SchedulerOutput
from engine.core.scheduler import Scheduler
from engine.core.sequence import SequenceStatus
from engine.core.tier import LoadJob
from engine.tiers.block_file import BlockName
from engine.tiers.disk import DiskTier
from tests.engine.scheduler_factories import EOS, make_prompt, make_seq, next_token

BLOCK_SIZE = 8
FP = bytes(16)
KEY = bytes(32)  # the blocks' MAC key


class PoolModel:
    """FakeModel's contract over a pool tensor [1 layer, K/V, blocks, block_size, 1, 1] of token ids."""

    def __init__(self, num_blocks: int) -> None:
        self.kv = torch.full((1, 2, num_blocks, BLOCK_SIZE, 1, 1), -1.0)

    def __call__(self, out: SchedulerOutput) -> dict[int, int]:
        for src, dst in out.block_copies:
            self.kv[:, :, dst] = self.kv[:, :, src]
        keys, values = (
            self.kv[0, 0].view(-1),
            self.kv[0, 1].view(-1),
        )  # a slot's index: block * BLOCK_SIZE + slot
        for s in out.scheduled:
            seq = s.seq
            start = seq.num_computed_tokens
            slots = self.slots(seq.block_table, range(start, start + s.num_new_tokens))
            ids = torch.tensor(seq.token_ids[start : start + s.num_new_tokens], dtype=self.kv.dtype)
            keys[slots], values[slots] = ids, -ids
        sampled = {}
        for s in out.scheduled:
            if s.samples:
                seq = s.seq
                context = self.context(seq.block_table, len(seq))
                assert context == seq.token_ids, f"seq {seq.seq_id} reads a corrupted context"
                sampled[seq.seq_id] = next_token(context)
        return sampled

    @staticmethod
    def slots(block_table: list[int], positions: range) -> torch.Tensor:
        return torch.tensor([block_table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in positions])

    def context(self, block_table: list[int], num_tokens: int) -> list[int]:
        """The token ids the pool holds for a sequence: one gather of K and one of V (per-slot tensor indexing
        made this model a third of the state machine's 15 s)."""
        slots = self.slots(block_table, range(num_tokens))
        ids = [int(v) for v in self.kv[0, 0].view(-1)[slots].tolist()]
        negs = [-int(v) for v in self.kv[0, 1].view(-1)[slots].tolist()]
        assert ids == negs, "K and V of a slot disagree"
        return ids


class TimedTier(DiskTier):
    """A disk tier whose loads finish at a set moment, so that a run is the same run every time (hypothesis replays
    it): "eager" finishes each load before `load` returns (a loader faster than the model's step, under which a load
    that starts too early writes its blocks before the step has read them); "late" starts them only when the test
    settles (a loader slower than the step)."""

    def __init__(self, *args, timing: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timing, self.delayed = timing, []
        self.handed: list[LoadJob] = []  # jobs handed over since the test last looked (step)

    def load(self, job: LoadJob) -> None:
        self.handed.append(job)
        if self.timing == "late":
            self.delayed.append(job)
        else:
            self._finish(job)

    def run_delayed(self) -> None:
        jobs, self.delayed = self.delayed, []
        for job in jobs:
            self._finish(job)

    def _finish(self, job: LoadJob) -> None:
        super().load(job)
        deadline = time.monotonic() + 30
        while not job.done:
            assert time.monotonic() < deadline, "the loader did not finish in 30 s"
            self.wait_for_load(0.01)


def make_tiered(
    num_blocks: int, directory: Path, *, timing: str = "", **overrides
) -> tuple[Scheduler, PoolModel, DiskTier]:
    """A scheduler over a disk tier in `directory`; `timing`: a TimedTier's, or "" for the tier's own threads."""
    model = PoolModel(num_blocks)
    if timing:
        tier = TimedTier(directory, 1 << 30, FP, model.kv, None, key=KEY, timing=timing)
    else:
        tier = DiskTier(directory, 1 << 30, FP, model.kv, None, key=KEY)
    kwargs = dict(block_size=BLOCK_SIZE, max_num_batched_tokens=64, max_model_len=128, max_num_seqs=4)
    kwargs.update(overrides)
    sched = Scheduler(EngineConfig(**kwargs), num_blocks, frozenset({EOS}), tier=tier)
    return sched, model, tier


def run(sched: Scheduler, model: PoolModel) -> None:
    """Step until nothing is left, letting each step's loads and writes finish before the next (so a run is the same
    run every time: hypothesis replays it)."""
    for _ in range(3000):
        if not sched.has_unfinished():
            return
        step(sched, model)
    raise AssertionError("no progress")


def step(sched: Scheduler, model: PoolModel) -> None:
    """One step, then wait for the tier's threads. An empty step waits for loads or only preempted (the next one
    admits); anything else is a stall."""
    out = sched.schedule()
    if isinstance(sched.tier, TimedTier):  # no load may fill a block before the step has copied from it
        sources = {src for src, _ in out.block_copies}
        assert not [j for j in sched.tier.handed if sources.intersection(j.block_ids)], (
            "a load took a copy's source"
        )
        sched.tier.handed.clear()
    if out.is_empty:
        assert sched.loading or out.preempted or not sched.has_unfinished(), (
            "nothing scheduled, nothing loading, nothing preempted: stalled"
        )
    else:
        sched.update(out, model(out))
        sched.block_manager.check_invariants([*sched.running, *sched.waiting], sched.held_block_ids())
    settle(sched)


def settle(sched: Scheduler) -> None:
    """Wait until the tier has written every queued block and finished every load in flight."""
    tier = sched.tier
    if isinstance(tier, TimedTier):
        tier.run_delayed()
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        if tier.stats().write_queue_depth == 0 and all(job.done for job in sched.loading.values()):
            return
        time.sleep(0.0002)  # a block's write takes ~0.3 ms: longer naps were most of the state machine's time
    raise AssertionError("the tier's threads did not finish in 4 s")


def generate(sched: Scheduler, model: PoolModel, seq_id: int, prompt: list[int], salt: str | None = None):
    seq = make_seq(seq_id, prompt, max_tokens=3)
    seq.chain_key = ChainKey(salt)
    sched.add_sequence(seq)
    run(sched, model)
    settle(sched)
    return seq


def evict_all(sched: Scheduler, model: PoolModel, seq_id: int) -> None:
    """Fill the whole pool with an unrelated prompt so every cached block is evicted."""
    generate(sched, model, seq_id, make_prompt(sched.block_manager.num_blocks * BLOCK_SIZE - 4, 999))
    assert sched.block_manager.stats().num_cached_blocks <= sched.block_manager.num_blocks


def test_the_chain_continues_from_ram_into_disk_and_the_sequence_waits_loading(tmp_path):
    sched, model, tier = make_tiered(12, tmp_path)
    prompt = make_prompt(41, 1)  # 5 full blocks before the last token
    first = generate(sched, model, 0, prompt)
    assert tier.stats().num_blocks == 5  # 43 tokens computed: 5 full blocks
    evict_all(sched, model, 1)
    assert sched.block_manager.match_prefix(make_seq(9, prompt)) == []
    again = make_seq(2, prompt + first.output_token_ids + [77], max_tokens=2)
    sched.add_sequence(again)
    out = sched.schedule()
    assert again.status is SequenceStatus.LOADING and out.is_empty
    assert len(sched.held_block_ids()) == 5
    run(sched, model)
    assert again.num_cached_tokens == 40 and again.num_disk_cached_tokens == 40
    assert sched.stats().disk_hit_tokens == 40
    assert again.output_token_ids == [next_token(again.token_ids[: 45 + i]) for i in range(2)]
    assert sched.block_manager.stats().num_used_blocks == 0


def test_ram_hits_are_pinned_while_the_rest_loads(tmp_path):
    sched, model, tier = make_tiered(16, tmp_path)
    prompt = make_prompt(65, 2)
    generate(sched, model, 0, prompt)
    generate(sched, model, 1, prompt[:16] + make_prompt(5, 3))  # its first block is now the most recent
    generate(sched, model, 2, make_prompt(112, 4))  # 15 of 16 blocks: only that one stays cached
    bm = sched.block_manager
    ram = bm.match_prefix(make_seq(9, prompt))
    assert len(ram) == 1
    again = make_seq(3, prompt, max_tokens=1)
    sched.add_sequence(again)
    sched.schedule()
    assert again.status is SequenceStatus.LOADING
    held = sched.held_block_ids()
    assert len(held) == 8 and held[0] == ram[0] and all(bm.blocks[b].ref_count == 1 for b in held)
    run(sched, model)
    assert again.num_cached_tokens == 64 and again.num_disk_cached_tokens == 56


def test_tenants_chains_never_cross_on_disk(tmp_path):
    sched, model, tier = make_tiered(12, tmp_path)
    prompt = make_prompt(41, 5)
    generate(sched, model, 0, prompt, salt="alice")
    evict_all(sched, model, 1)
    bob = generate(sched, model, 2, prompt, salt="bob")
    assert bob.num_cached_tokens == 0 and sched.stats().disk_hit_tokens == 0
    evict_all(sched, model, 3)
    alice = generate(sched, model, 4, prompt, salt="alice")
    assert alice.num_cached_tokens == 40 and alice.num_disk_cached_tokens == 40


def test_abort_while_loading_releases_every_block_once_the_loader_is_done(tmp_path):
    sched, model, tier = make_tiered(12, tmp_path)
    prompt = make_prompt(41, 6)
    generate(sched, model, 0, prompt)
    evict_all(sched, model, 1)
    seq = make_seq(2, prompt, max_tokens=2)
    sched.add_sequence(seq)
    sched.schedule()
    assert seq.status is SequenceStatus.LOADING
    sched.abort(seq.request_id)
    assert seq.is_finished and sched.has_unfinished()  # the load is still in flight
    run(sched, model)
    stats = sched.stats()
    assert (stats.num_used_blocks, stats.num_loading) == (0, 0)
    assert stats.num_cached_blocks + stats.num_free_blocks == 12


# The machine writes ~10,000 block files a run: in memory where the machine has a tmpfs (a third faster here).
MEMORY_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class TierMachine(RuleBasedStateMachine):
    """Random add / step / abort / drain with a disk tier, plus damaged files and restarts of the whole engine."""

    @initialize(
        num_blocks=st.integers(8, 16),
        budget=st.sampled_from([8, 13, 32]),
        timing=st.sampled_from(["eager", "late"]),
    )
    def setup(self, num_blocks: int, budget: int, timing: str) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="tier-machine-", dir=MEMORY_DIR))
        self.num_blocks, self.budget, self.timing = num_blocks, budget, timing
        self.next_id = 0
        self.stems = [make_prompt(40, seed) for seed in range(3)]
        self._start()

    def _start(self) -> None:
        self.sched, self.model, self.tier = make_tiered(
            self.num_blocks,
            self.dir,
            timing=self.timing,
            max_num_batched_tokens=self.budget,
            max_model_len=128,
        )

    @rule(
        stem=st.integers(0, 2),
        stem_len=st.integers(1, 40),
        suffix=st.integers(0, 6),
        salt=st.sampled_from([None, "a"]),
    )
    def add(self, stem: int, stem_len: int, suffix: int, salt: str | None) -> None:
        seq = make_seq(
            self.next_id, self.stems[stem][:stem_len] + make_prompt(suffix, 100 + self.next_id), max_tokens=4
        )
        seq.chain_key = ChainKey(salt)
        self.sched.add_sequence(seq)
        self.next_id += 1

    @precondition(lambda self: self.sched.has_unfinished())
    @rule()
    def step(self) -> None:
        step(self.sched, self.model)

    @precondition(lambda self: self.sched.request_to_seqs)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.sched.abort(data.draw(st.sampled_from(sorted(self.sched.request_to_seqs))))
        settle(self.sched)  # the blocks it offered are on disk before the next step, as after every step

    @rule()
    def flood(self) -> None:
        """Run an unrelated prompt that needs the whole pool, evicting every cached block to the tier."""
        run(self.sched, self.model)
        settle(self.sched)
        prompt = make_prompt(min(self.num_blocks * BLOCK_SIZE - 8, 120), 500 + self.next_id)
        self.sched.add_sequence(make_seq(self.next_id, prompt, max_tokens=2))
        self.next_id += 1
        run(self.sched, self.model)

    @rule()
    def drain(self) -> None:
        run(self.sched, self.model)
        settle(self.sched)

    @rule(data=st.data(), how=st.sampled_from(["flip", "truncate", "delete"]))
    def damage_a_file(self, data: st.DataObject, how: str) -> None:
        settle(self.sched)  # the files on disk do not depend on the writer's timing
        files = sorted(self.dir.glob("*.kvb"))
        if not files:
            return
        path = data.draw(st.sampled_from(files))
        raw = bytearray(path.read_bytes())
        if how == "flip":
            raw[-1 - min(data.draw(st.integers(0, 40)), len(raw) - 1)] ^= 0x10
            path.write_bytes(bytes(raw))
        elif how == "truncate":
            path.write_bytes(bytes(raw[: len(raw) // 2]))
        else:
            path.unlink()

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        """Stop everything and start a new engine on the same directory (a crash leaves a temporary behind)."""
        run(self.sched, self.model)
        self.tier.close()
        if crash:
            leftover = BlockName(FP, NO_SALT, os.urandom(16)).filename + ".1.tmp"  # as the writer names them
            (self.dir / leftover).write_bytes(b"cut short")
        self._start()
        assert not list(self.dir.glob("*.tmp"))

    @invariant()
    def pool_is_consistent(self) -> None:
        if hasattr(self, "sched"):
            self.sched.block_manager.check_invariants(
                [*self.sched.running, *self.sched.waiting], self.sched.held_block_ids()
            )

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        try:
            run(self.sched, self.model)
            stats = self.sched.stats()
            assert stats.num_used_blocks == 0 and stats.num_loading == 0
        finally:
            self.tier.close()
            shutil.rmtree(self.dir, ignore_errors=True)


TierMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestTierStates = TierMachine.TestCase


def test_pins_of_a_loaded_sequence_never_keep_the_head_of_the_queue_out(tmp_path):
    """A loaded sequence waits with its blocks pinned; a preempted sequence ahead of it that needs those blocks gets
    them (the pins are released, the blocks stay cached) instead of both waiting for ever."""
    sched, model, tier = make_tiered(20, tmp_path)
    returning = make_prompt(97, 1)  # 12 full blocks before the last token
    generate(sched, model, 0, returning)
    evict_all(sched, model, 1)
    sched.add_sequence(make_seq(2, returning, max_tokens=3))
    sched.add_sequence(make_seq(3, make_prompt(70, 5), max_tokens=3))
    for _ in range(200):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        if out.is_empty:  # a step that only preempts admits nothing; the next must make progress
            assert sched.loading or out.preempted, (
                "nothing scheduled, nothing loading, sequences waiting: stalled"
            )
            tier.wait_for_load(0.05)
            continue
        sched.update(out, model(out))
        tier.wait_for_load(0.02)  # a model step's time: the load completes meanwhile
    assert not sched.has_unfinished()
    assert sched.block_manager.stats().num_used_blocks == 0


def test_loads_count_against_max_num_seqs(tmp_path):
    sched, model, tier = make_tiered(40, tmp_path, max_num_seqs=1)
    prompts = [make_prompt(41, 10 + u) for u in range(3)]
    for u, prompt in enumerate(prompts):
        generate(sched, model, u, prompt)
    evict_all(sched, model, 9)
    for u, prompt in enumerate(prompts):
        sched.add_sequence(make_seq(20 + u, prompt, max_tokens=1))
    sched.schedule()
    assert len(sched.loading) == 1
    run(sched, model)


def replay(num_blocks: int, budget: int, timing: str, rules: list[tuple[str, dict]]) -> None:
    """Run a fixed sequence of TierMachine rules, checking the pool after each, then its teardown."""
    machine = TierMachine()
    machine.setup(num_blocks=num_blocks, budget=budget, timing=timing)
    try:
        for name, kwargs in rules:
            getattr(machine, name)(**kwargs)
            machine.pool_is_consistent()
    finally:
        machine.teardown()


def add(salt: str | None, stem: int, stem_len: int, suffix: int) -> tuple[str, dict]:
    return "add", dict(salt=salt, stem=stem, stem_len=stem_len, suffix=suffix)


def test_a_load_never_fills_a_block_before_its_step_has_copied_from_it():
    """Found by the machine (shrunk): an admission's partial block is copied from a cached block that is free, and a
    load picked later in the same step took that very block; a loader faster than the step wrote it before the model
    copied from it, and the sequence read another prompt's tokens. Loads now start once the step's copies ran."""
    flood = ("flood", {})
    rules = [
        ("restart", dict(crash=False)), flood, add("a", 0, 35, 0), add(None, 0, 25, 0), flood,
        add(None, 0, 40, 6), add("a", 1, 9, 0), add("a", 0, 14, 0), add(None, 0, 34, 0), add("a", 1, 9, 0),
    ]  # fmt: skip
    replay(9, 8, "eager", [*rules, flood])


@pytest.mark.parametrize("timing", ["eager", "late"])
def test_a_loaded_sequence_is_admitted_on_its_own_pins_not_on_copies_of_them(timing):
    """Found by the machine (shrunk): while a sequence loaded its prefix, another computed the same blocks; admitted,
    it matched those (found first) and kept its own pins idle, holding the room it lacked: nothing ran again."""
    rules = [
        add("a", 0, 33, 2), add(None, 0, 36, 0), add("a", 1, 29, 6), add("a", 2, 33, 5), add("a", 1, 28, 4),
        add("a", 0, 32, 1), add("a", 0, 33, 1), add("a", 1, 18, 6), add("a", 0, 8, 2), add(None, 0, 16, 2),
    ]  # fmt: skip
    replay(8, 13, timing, [*rules, add("a", 2, 36, 6), add("a", 2, 36, 6)])

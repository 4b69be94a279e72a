"""The prefix cache's hash listing (BlockManager.cached_hash_prefixes) and the scheduler's cache digest."""

from __future__ import annotations

from engine.core.block_manager import BlockManager
from engine.core.hash_chain import HASH_PREFIX_BYTES, NO_SALT, ChainKey, salt_tag
from tests.engine.scheduler_factories import make_prompt, make_scheduler
from tests.engine.scheduler_factories import make_seq as make_sched_seq
from tests.engine.test_block_manager import make_seq, run_prompt

N = HASH_PREFIX_BYTES
EMPTY = bytes(N)


def by_block(bm: BlockManager) -> list[bytes]:
    """The listing cut into one prefix a block."""
    prefixes = bm.cached_hash_prefixes()
    return [prefixes[i * N : (i + 1) * N] for i in range(bm.num_blocks)]


def test_listing_tracks_store_free_and_eviction() -> None:
    bm = BlockManager(4, 4)
    assert by_block(bm) == [EMPTY] * 4
    a = make_seq(list(range(10)))  # 2 full blocks and 2 tokens: blocks 0, 1 (hashed), 2
    run_prompt(bm, a)
    a0, a1 = (h[:N] for h in a.block_hashes[:2])
    assert by_block(bm) == [a0, a1, EMPTY, EMPTY]  # in use, cached
    bm.free(a)
    assert by_block(bm) == [a0, a1, EMPTY, EMPTY]  # evictable, still cached
    b = make_seq(
        list(range(100, 109)), seq_id=1
    )  # 3 blocks: the 2 free ones, then block 1 (the tail goes first)
    run_prompt(bm, b)
    assert b.block_table == [2, 3, 1]
    b0, b1 = (h[:N] for h in b.block_hashes[:2])
    assert by_block(bm) == [a0, EMPTY, b0, b1]  # a's second block was evicted
    bm.check_invariants([b])


def test_listing_is_copied_only_after_a_change() -> None:
    bm = BlockManager(8, 4)
    a = make_seq(list(range(8)))
    run_prompt(bm, a)
    first = bm.cached_hash_prefixes()
    assert bm.cached_hash_prefixes() is first  # nothing changed: the same bytes, no copy
    twin = make_seq([*range(8), 99], seq_id=1)
    run_prompt(bm, twin)  # a hit on both full blocks, the partial one holds no hash: nothing stored
    assert bm.cached_hash_prefixes() is first
    a.token_ids.extend(range(8, 12))
    assert bm.allocate_slots(a, 4) == []
    a.num_computed_tokens = 12
    bm.cache_full_blocks(a)
    assert a.block_table == [0, 1, 3]  # the twin's partial block is 2
    assert by_block(bm) == [*(h[:N] for h in a.block_hashes[:2]), EMPTY, a.block_hashes[2][:N], *[EMPTY] * 4]
    bm.check_invariants([a, twin])


def test_listing_follows_purges_and_loaded_blocks() -> None:
    bm = BlockManager(8, 4)
    seq = make_seq(list(range(8)))
    seq.chain_key = ChainKey("tenant-a")
    run_prompt(bm, seq)
    bm.free(seq)
    assert sum(p != EMPTY for p in by_block(bm)) == 2
    assert bm.purge_salt(salt_tag("tenant-a")) == 2
    assert by_block(bm) == [EMPTY] * 8
    [held] = bm.reserve(1, [])
    bm.register(held, b"\x01" * 16, NO_SALT)  # a block loaded from the disk tier joins the cache
    assert by_block(bm)[held] == b"\x01" * N
    bm.check_invariants([], held=[held])


def test_scheduler_digest_counts_the_queues_and_the_room() -> None:
    sched = make_scheduler(num_blocks=16, max_num_seqs=1)
    first = make_sched_seq(0, make_prompt(20), max_tokens=4)
    second = make_sched_seq(1, make_prompt(20, seed=1), max_tokens=4)
    sched.add_sequence(first)
    sched.add_sequence(second)
    out = sched.schedule()  # one slot: the first runs, the second waits
    sched.update(out, {s.seq.seq_id: 11 for s in out.scheduled if s.samples})
    digest = sched.cache_digest()
    assert (digest.num_running, digest.num_waiting, digest.max_num_seqs) == (1, 1, 1)
    assert (digest.num_blocks, digest.block_size) == (16, 8)
    assert digest.num_free_blocks == 16 - 3  # 21 tokens in blocks of 8
    assert digest.hash_prefixes == sched.block_manager.cached_hash_prefixes()
    listed = {digest.hash_prefixes[i * N : (i + 1) * N] for i in range(16)} - {EMPTY}
    assert listed == {h[:N] for h in first.block_hashes[:2]}

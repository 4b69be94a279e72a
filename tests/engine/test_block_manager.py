"""BlockManager on tiny pools, with exact block ids."""

from __future__ import annotations

import pytest

from engine.core.block_manager import CACHED, FREE, IN_USE, BlockManager
from engine.core.sequence import SamplingParams, Sequence


def make_seq(token_ids: list[int], seq_id: int = 0) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(token_ids), len(token_ids), SamplingParams(), 0.0)


def admit(bm: BlockManager, seq: Sequence, num_new_tokens: int | None = None) -> list[tuple[int, int]] | None:
    cached = bm.match_prefix(seq)
    if num_new_tokens is None:
        num_new_tokens = len(seq) - len(cached) * bm.block_size
    return bm.allocate_slots(seq, num_new_tokens, cached)


def compute(bm: BlockManager, seq: Sequence, num_new_tokens: int) -> None:
    """What the scheduler's update does: the KV of those tokens is now stored."""
    seq.num_computed_tokens += num_new_tokens
    bm.cache_full_blocks(seq)


def run_prompt(bm: BlockManager, seq: Sequence) -> None:
    assert admit(bm, seq) == []
    compute(bm, seq, len(seq) - seq.num_computed_tokens)


def test_allocate_takes_lru_head_and_hashes_full_blocks() -> None:
    bm = BlockManager(8, 4)
    seq = make_seq(list(range(10)))
    assert admit(bm, seq) == []
    assert seq.block_table == [0, 1, 2]
    assert list(bm.free_queue) == [3, 4, 5, 6, 7]
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (10, 0)
    compute(bm, seq, 10)
    assert seq.num_hashed_blocks == 2
    assert [bm.blocks[b].block_hash for b in seq.block_table] == [*seq.block_hashes, None]
    assert seq.block_hashes[0] == bm.hash_block(b"", [0, 1, 2, 3])
    assert seq.block_hashes[1] == bm.hash_block(seq.block_hashes[0], [4, 5, 6, 7])
    s = bm.stats()
    assert (s.num_free_blocks, s.num_cached_blocks, s.num_used_blocks, s.num_shared_blocks) == (5, 0, 3, 0)
    bm.check_invariants([seq])


def test_append_across_a_block_boundary() -> None:
    bm = BlockManager(8, 4)
    seq = make_seq(list(range(7)))
    run_prompt(bm, seq)
    seq.token_ids.append(7)
    assert bm.allocate_slots(seq, 1) == []
    assert seq.block_table == [0, 1]  # slot 7 is the last of block 1
    compute(bm, seq, 1)
    assert seq.num_hashed_blocks == 2  # generated tokens are hashed like prompt tokens
    seq.token_ids.append(8)
    assert bm.allocate_slots(seq, 1) == []
    assert seq.block_table == [0, 1, 2]
    compute(bm, seq, 1)
    bm.check_invariants([seq])


def test_free_evicts_tail_before_prefix_and_unhashed_blocks_first() -> None:
    bm = BlockManager(8, 4)
    a, b = make_seq(list(range(8)), 0), make_seq(list(range(100, 108)), 1)
    run_prompt(bm, a)
    run_prompt(bm, b)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    bm.free(a)
    bm.free(b)
    assert list(bm.free_queue) == [4, 5, 6, 7, 1, 0, 3, 2]
    assert bm.stats().num_cached_blocks == 4
    c = make_seq(list(range(200, 218)), 2)
    run_prompt(bm, c)
    assert c.block_table == [4, 5, 6, 7, 1]  # block 1 (a's tail) evicted, a's first block still cached
    assert bm.match_prefix(make_seq([*range(8), 99])) == [0]
    assert bm.match_prefix(make_seq([*range(100, 108), 99])) == [2, 3]
    # c's partial (unhashed) last block goes to the head: it holds nothing worth keeping
    bm.free(c)
    assert list(bm.free_queue) == [1, 0, 3, 2, 7, 6, 5, 4]
    bm.check_invariants([])


def test_no_room_returns_none_and_changes_nothing() -> None:
    bm = BlockManager(4, 4)
    a = make_seq(list(range(9)), 0)
    run_prompt(bm, a)
    bm.free(a)
    assert list(bm.free_queue) == [2, 3, 1, 0]
    # 17 tokens: 2 cached blocks reused at ref 0, 3 new ones needed, only 2 others free
    b = make_seq([*range(8), *range(50, 59)], 1)
    assert bm.match_prefix(b) == [0, 1]
    assert admit(bm, b) is None
    assert (b.block_table, b.num_computed_tokens, b.num_cached_tokens) == ([], 0, 0)
    assert list(bm.free_queue) == [2, 3, 1, 0]
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (9, 0)
    b.token_ids.pop()  # 16 tokens fit exactly
    assert admit(bm, b) == []
    assert (b.block_table, b.num_computed_tokens, b.num_cached_tokens) == ([0, 1, 2, 3], 8, 8)
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (25, 8)


def test_fork_shares_blocks_and_copies_on_write() -> None:
    bm = BlockManager(8, 4)
    parent = make_seq(list(range(6)), 0)
    run_prompt(bm, parent)
    parent.token_ids.append(100)
    child = make_seq([*range(6), 200], 1)
    child.num_computed_tokens = 6
    bm.fork(parent, child)
    assert child.block_table == [0, 1]
    assert [bm.blocks[i].ref_count for i in (0, 1)] == [2, 2]
    assert bm.stats().num_shared_blocks == 2
    assert child.num_hashed_blocks == 1 and child.block_hashes == parent.block_hashes[:1]
    bm.check_invariants([parent, child])
    assert bm.allocate_slots(parent, 1) == [(1, 2)]
    assert parent.block_table == [0, 2]
    assert bm.allocate_slots(child, 1) == []  # block 1 is now the child's alone
    assert child.block_table == [0, 1]
    compute(bm, parent, 1)
    compute(bm, child, 1)
    assert bm.stats().num_shared_blocks == 1
    bm.check_invariants([parent, child])


def test_fork_of_block_aligned_sequence_needs_no_copy() -> None:
    bm = BlockManager(8, 4)
    parent = make_seq(list(range(8)), 0)
    run_prompt(bm, parent)
    parent.token_ids.append(100)
    child = make_seq([*range(8), 200], 1)
    child.num_computed_tokens = 8
    bm.fork(parent, child)
    assert bm.allocate_slots(parent, 1) == []
    assert bm.allocate_slots(child, 1) == []
    assert (parent.block_table, child.block_table) == ([0, 1, 2], [0, 1, 3])


def test_copy_on_write_counts_against_room() -> None:
    bm = BlockManager(2, 4)
    parent = make_seq(list(range(6)), 0)
    run_prompt(bm, parent)
    parent.token_ids.append(100)
    child = make_seq([*range(6), 200], 1)
    child.num_computed_tokens = 6
    bm.fork(parent, child)
    assert bm.allocate_slots(parent, 1) is None
    assert parent.block_table == child.block_table == [0, 1]
    assert [b.ref_count for b in bm.blocks] == [2, 2]
    bm.free(child)
    assert bm.allocate_slots(parent, 1) == []  # sole owner again: written in place


def test_prefix_hit_always_leaves_the_last_token_to_compute() -> None:
    bm = BlockManager(8, 4)
    a = make_seq(list(range(8)), 0)
    run_prompt(bm, a)
    b = make_seq(list(range(8)), 1)  # block-aligned and fully cached: still computes its last block
    assert bm.match_prefix(b) == [0]
    assert admit(bm, b) == []
    assert (b.block_table, b.num_computed_tokens, b.num_cached_tokens) == ([0, 2], 4, 4)
    c = make_seq([*range(8), 9], 2)
    assert admit(bm, c) == []
    assert (c.block_table, c.num_computed_tokens, c.num_cached_tokens) == ([0, 1, 3], 8, 8)
    assert [bm.blocks[i].ref_count for i in range(4)] == [3, 2, 1, 1]
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (8 + 8 + 9, 4 + 8)
    compute(bm, b, 4)
    compute(bm, c, 1)
    bm.check_invariants([a, b, c])


def test_duplicate_hashes_are_tolerated() -> None:
    bm = BlockManager(8, 4)
    a, b = make_seq([*range(8), 50], 0), make_seq([*range(8), 60], 1)
    assert admit(bm, a) == [] and admit(bm, b) == []  # admitted together: no hit for b
    compute(bm, a, 9)
    compute(bm, b, 9)
    assert (a.block_table, b.block_table) == ([0, 1, 2], [3, 4, 5])
    assert list(bm.hash_to_block_ids[a.block_hashes[0]]) == [0, 3]
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    assert list(bm.free_queue) == [5, 2, 6, 7, 1, 0, 4, 3]
    d = make_seq(list(range(300, 320)), 2)
    run_prompt(bm, d)
    assert d.block_table == [5, 2, 6, 7, 1]
    assert bm.match_prefix(make_seq([*range(8), 70])) == [0, 4]  # block 1 evicted, its twin 4 still cached
    bm.check_invariants([d])


def test_salt_changes_hashes() -> None:
    tokens = [1, 2, 3, 4]
    plain, salted, salted_again = (
        BlockManager(4, 4),
        BlockManager(4, 4, hash_salt=b"t1"),
        BlockManager(4, 4, True, b"t1"),
    )
    assert salted.hash_block(b"", tokens) == salted_again.hash_block(b"", tokens)
    assert salted.hash_block(b"", tokens) != plain.hash_block(b"", tokens)
    assert BlockManager(4, 4, hash_salt=b"t2").hash_block(b"", tokens) != salted.hash_block(b"", tokens)
    parent = plain.hash_block(b"", [9, 9, 9, 9])
    assert plain.hash_block(parent, tokens) != plain.hash_block(b"", tokens)
    assert len(parent) == 16


def test_prefix_caching_off_hashes_and_matches_nothing() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = make_seq(list(range(9)), 0)
    run_prompt(bm, a)
    assert a.num_hashed_blocks == 0 and a.block_hashes == []
    bm.free(a)
    assert list(bm.free_queue) == [0, 1, 2, 3, 4, 5, 6, 7]
    b = make_seq(list(range(9)), 1)
    assert bm.match_prefix(b) == []
    run_prompt(bm, b)
    s = bm.stats()
    assert (s.prefix_query_tokens, s.prefix_hit_tokens, s.num_cached_blocks, b.num_cached_tokens) == (
        0,
        0,
        0,
        0,
    )


def test_snapshot_states_refs_and_hash_prefixes() -> None:
    bm = BlockManager(4, 4)
    a, b = make_seq([*range(4), 7], 0), make_seq(list(range(10, 15)), 1)
    run_prompt(bm, a)
    run_prompt(bm, b)
    bm.free(a)
    states, refs, hashes = bm.snapshot()
    assert states == [CACHED, FREE, IN_USE, IN_USE]
    assert (b.block_table, refs) == ([2, 3], [0, 0, 1, 1])
    assert hashes == {0: a.block_hashes[0].hex()[:8], 2: b.block_hashes[0].hex()[:8]}
    # the admin feed asks for the hashes of the blocks it shows one by one (ids past the pool are no error)
    assert bm.snapshot(range(1, 9)) == (states, refs, {2: b.block_hashes[0].hex()[:8]})
    assert bm.snapshot(range(0))[2] == {}


def test_check_invariants_catches_corruption() -> None:
    bm = BlockManager(4, 4)
    a = make_seq(list(range(5)), 0)
    run_prompt(bm, a)
    bm.check_invariants([a])
    bm.blocks[1].ref_count += 1
    with pytest.raises(AssertionError, match="ref sum"):
        bm.check_invariants([a])
    bm.blocks[0].ref_count -= 1  # the sum is right again, the per-block count is not
    with pytest.raises(AssertionError, match="block 0: ref 0, 1 users"):
        bm.check_invariants([a])
    bm.blocks[0].ref_count += 1
    bm.blocks[1].ref_count -= 1
    bm.check_invariants([a])
    a.num_computed_tokens = 3
    with pytest.raises(AssertionError, match="allocated slots hold no KV"):
        bm.check_invariants([a])


def test_caller_bugs_raise_runtime_error() -> None:
    bm = BlockManager(4, 4)
    a = make_seq(list(range(5)), 0)
    run_prompt(bm, a)
    with pytest.raises(RuntimeError, match="already holds blocks"):
        bm.match_prefix(a)
    with pytest.raises(RuntimeError, match="slots up to 6"):
        bm.allocate_slots(a, 1)

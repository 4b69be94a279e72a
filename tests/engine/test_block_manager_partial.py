"""BlockManager: a prompt that forks inside a cached block gets a copy of it (copy-on-write) instead of recomputing
the tokens before the fork; tiny pools, exact block ids."""

from __future__ import annotations

from engine.core.block_manager import BlockManager
from engine.core.hash_chain import ChainKey
from tests.engine.test_block_manager import compute, make_seq


def run(bm: BlockManager, token_ids: list[int], seq_id: int = 0) -> None:
    """Admit, compute and free a sequence: its full blocks stay cached."""
    seq = make_seq(token_ids, seq_id)
    assert admit_partial(bm, seq) is not None
    compute(bm, seq, len(seq) - seq.num_computed_tokens)
    bm.free(seq)


def admit_partial(bm: BlockManager, seq) -> list[tuple[int, int]] | None:
    """What the scheduler's admission does: cached full blocks, then a copy of the block it forks inside."""
    cached = bm.match_prefix(seq)
    partial = bm.match_partial(seq, len(cached))
    num_cached = len(cached) * bm.block_size + (partial[1] if partial else 0)
    return bm.allocate_slots(seq, len(seq) - num_cached, cached, partial)


def test_a_fork_inside_a_cached_block_copies_it() -> None:
    bm = BlockManager(8, 4)
    run(bm, list(range(12)))  # blocks 0, 1, 2 cached: [0..3] [4..7] [8..11]
    assert list(bm.free_queue) == [3, 4, 5, 6, 7, 2, 1, 0]
    fork = make_seq([0, 1, 2, 3, 4, 5, 99, 98], seq_id=1)  # parts from block 1 after two of its tokens
    assert bm.match_prefix(fork) == [0]
    assert bm.match_partial(fork, 1) == (1, 2)
    assert admit_partial(bm, fork) == [(1, 3)]  # block 1's KV is copied into the fork's own block 3
    assert fork.block_table == [0, 3]
    assert (fork.num_computed_tokens, fork.num_cached_tokens) == (6, 6)  # computing starts at the fork
    assert (bm.prefix_query_tokens, bm.prefix_hit_tokens) == (20, 6)
    compute(bm, fork, 2)
    assert bm.blocks[3].token_ids == (4, 5, 99, 98) and bm.blocks[1].token_ids == (4, 5, 6, 7)
    assert list(bm.parent_to_block_ids[bm.blocks[1].parent_key]) == [1, 3]  # both versions are candidates now
    bm.check_invariants([fork])


def test_the_same_prompt_again_copies_up_to_its_last_token() -> None:
    bm = BlockManager(8, 4)
    run(bm, list(range(12)))  # a 10-token prompt and 2 generated tokens filled block 2
    again = make_seq(list(range(10)), seq_id=1)
    assert admit_partial(bm, again) == [(2, 3)]
    assert again.num_cached_tokens == 9  # all but the last token, which yields the logits
    bm.check_invariants([again])


def test_the_longest_shared_start_wins_and_newer_blocks_are_tried_first() -> None:
    bm = BlockManager(8, 4)
    run(bm, [0, 1, 2, 3, 4, 5, 6, 7], seq_id=0)
    run(bm, [0, 1, 2, 3, 4, 9, 9, 9], seq_id=1)
    run(bm, [0, 1, 2, 3, 4, 5, 9, 9], seq_id=2)
    siblings = list(bm.parent_to_block_ids[bm.blocks[1].parent_key])
    assert len(siblings) == 3
    assert bm.match_partial(make_seq([0, 1, 2, 3, 4, 5, 6, 1, 1], seq_id=3), 1) == (siblings[0], 3)
    assert bm.match_partial(make_seq([0, 1, 2, 3, 4, 5, 1, 1], seq_id=4), 1) == (siblings[2], 2)
    assert bm.match_partial(make_seq([0, 1, 2, 3, 7, 7], seq_id=5), 1) is None  # parts at the block's start


def test_the_source_may_be_the_block_handed_out() -> None:
    bm = BlockManager(2, 4)
    run(bm, list(range(8)))  # both blocks cached; free queue [1, 0]
    fork = make_seq([0, 1, 2, 3, 4, 5, 99], seq_id=1)
    assert admit_partial(bm, fork) == []  # block 1 is its own copy: nothing to copy, its hash is dropped
    assert fork.block_table == [0, 1] and fork.num_computed_tokens == 6
    assert (
        bm.blocks[1].block_hash is None
        and bm.blocks[1].parent_key is None
        and bm.parent_to_block_ids == {bm.blocks[0].parent_key: {0: None}}
    )
    bm.check_invariants([fork])


def test_no_copy_across_chains_without_room_or_when_off() -> None:
    bm = BlockManager(4, 4)
    run(bm, list(range(8)))
    salted = make_seq([0, 1, 2, 3, 4, 5, 9], seq_id=1)
    salted.chain_key = ChainKey("tenant-b")
    assert bm.match_prefix(salted) == [] and bm.match_partial(salted, 0) is None  # another tenant's chain
    holder = make_seq([50, 51, 52, 53, 54, 55, 56, 57, 58], seq_id=2)
    assert admit_partial(bm, holder) == []  # takes 3 of the 4 blocks, evicting the cached ones but block 0...
    fork = make_seq([0, 1, 2, 3, 4, 5, 9, 9, 9, 9], seq_id=3)
    before = (list(bm.free_queue), dict(bm.parent_to_block_ids))
    assert admit_partial(bm, fork) is None  # ...so the fork has no room: nothing changed
    assert (list(bm.free_queue), dict(bm.parent_to_block_ids)) == before and fork.block_table == []
    off = BlockManager(8, 4, copy_partial_blocks=False)
    run(off, list(range(12)))
    assert off.match_partial(make_seq([0, 1, 2, 3, 4, 5, 99], seq_id=1), 1) is None
    assert off.parent_to_block_ids == {} and all(b.parent_key is None for b in off.blocks)

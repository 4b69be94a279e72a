"""The torch paged-attention backend equals the per-sequence reference on ragged, GQA and shared-prefix batches."""

from __future__ import annotations

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend, split_by_length
from kernels.reference import paged_attention_ref
from tests.engine.factories import make_attention_metadata, make_block_tables

BLOCK_SIZE = 16
NUM_BLOCKS = 40
HEAD_DIM = 32
SEQ_LENS = [1, 15, 17, 100]


def _inputs(num_tokens, num_heads, num_kv_heads, dtype, seed, num_blocks=NUM_BLOCKS):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(dtype)

    cache_shape = (num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
    # every slot holds finite garbage: context written by "earlier steps" and stale slots the mask must hide
    return (
        rand(num_tokens, num_heads, HEAD_DIM),
        rand(num_tokens, num_kv_heads, HEAD_DIM),
        rand(num_tokens, num_kv_heads, HEAD_DIM),
        rand(*cache_shape) * 3,
        rand(*cache_shape) * 3,
    )


def _check(
    query_lens,
    seq_lens,
    tables,
    num_heads,
    num_kv_heads,
    dtype=torch.float32,
    atol=1e-5,
    seed=0,
    num_blocks=40,
):
    meta = make_attention_metadata(query_lens, seq_lens, tables, BLOCK_SIZE)
    q, k, v, k_cache, v_cache = _inputs(sum(query_lens), num_heads, num_kv_heads, dtype, seed, num_blocks)
    ref_k_cache, ref_v_cache = k_cache.clone(), v_cache.clone()
    backend = TorchAttentionBackend()
    backend.prepare(meta)
    out = backend.forward(q, k, v, k_cache, v_cache, meta, HEAD_DIM**-0.5)

    slots = meta.slot_mapping
    ref_k_cache.view(-1, num_kv_heads, HEAD_DIM)[slots] = k
    ref_v_cache.view(-1, num_kv_heads, HEAD_DIM)[slots] = v
    assert torch.equal(k_cache, ref_k_cache) and torch.equal(v_cache, ref_v_cache)
    expected = paged_attention_ref(
        q, ref_k_cache, ref_v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, HEAD_DIM**-0.5
    )
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out, expected, atol=atol, rtol=0)
    return out


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (8, 2)], ids=["mha", "gqa3", "gqa4"])
@pytest.mark.parametrize(
    "query_lens",
    [[1, 1, 1, 1], [1, 15, 17, 100], [1, 3, 1, 40], [1, 15, 1, 1]],
    ids=["decode", "prefill", "chunked", "mixed"],
)
def test_ragged_batches_match_reference(query_lens, num_heads, num_kv_heads):
    tables = make_block_tables(SEQ_LENS, BLOCK_SIZE, NUM_BLOCKS, seed=len(query_lens) + num_heads)
    _check(query_lens, SEQ_LENS, tables, num_heads, num_kv_heads)


def test_shared_prefix_blocks_in_two_tables():
    # two sequences share their first two (full) blocks, as after a prefix-cache hit
    shared = [7, 31]
    tables = [shared + [3, 12], shared + [25], [0, 9]]
    seq_lens = [60, 40, 20]
    _check([28, 8, 1], seq_lens, tables, num_heads=6, num_kv_heads=2)
    _check([1, 1, 1], seq_lens, tables, num_heads=6, num_kv_heads=2, seed=1)


def test_bf16_within_rounding_of_fp32_reference():
    tables = make_block_tables(SEQ_LENS, BLOCK_SIZE, NUM_BLOCKS, seed=9)
    _check([1, 1, 1, 1], SEQ_LENS, tables, 8, 2, dtype=torch.bfloat16, atol=2e-2)
    _check([1, 15, 2, 100], SEQ_LENS, tables, 8, 2, dtype=torch.bfloat16, atol=2e-2)


def test_plan_follows_a_new_metadata_without_prepare():
    backend = TorchAttentionBackend(BLOCK_SIZE)
    q, k, v, k_cache, v_cache = _inputs(4, 4, 2, torch.float32, seed=5)
    for seq_lens in ([1, 15, 17, 100], [2, 16, 18, 101]):
        tables = make_block_tables(seq_lens, BLOCK_SIZE, NUM_BLOCKS, seed=4)
        meta = make_attention_metadata([1, 1, 1, 1], seq_lens, tables, BLOCK_SIZE)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.5)  # no prepare: the plan is rebuilt
        expected = paged_attention_ref(
            q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.5
        )
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_split_by_length_groups_uneven_lengths():
    assert split_by_length([1, 1, 2, 7], max_groups=4, min_saving=32) == [0, 4]  # saving 15: one group
    assert split_by_length([1] * 40 + [19, 19], max_groups=4, min_saving=32) == [0, 40, 42]
    assert split_by_length([2] * 30 + [10] * 30 + [40] * 30, 4, 32) == [0, 30, 60, 90]
    assert split_by_length([2] * 30 + [10] * 30 + [40] * 30, 2, 32) == [0, 60, 90]


def test_uneven_decode_batch_split_into_groups_matches_reference():
    # 40 short sequences and 2 long ones, interleaved: attended as two length groups, rows scattered back
    seq_lens = [5 + i % 7 for i in range(42)]
    seq_lens[3], seq_lens[30] = 300, 250
    tables = make_block_tables(seq_lens, BLOCK_SIZE, 120, seed=6)
    meta = make_attention_metadata([1] * 42, seq_lens, tables, BLOCK_SIZE)
    plan = TorchAttentionBackend(BLOCK_SIZE)._make_plan(meta, BLOCK_SIZE)
    assert [g.valid.shape[0] for g in plan.decode_groups] == [40, 2]
    assert plan.decode_groups[1].rows.tolist() == [30, 3]
    _check([1] * 42, seq_lens, tables, 6, 2, num_blocks=120)

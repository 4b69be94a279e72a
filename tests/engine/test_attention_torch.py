"""The torch paged-attention backend equals the per-sequence reference on ragged, GQA and shared-prefix batches."""

from __future__ import annotations

import pytest
import torch

from engine.attention_torch import TorchAttentionBackend
from kernels.reference import paged_attention_ref
from tests.engine.factories import make_attention_metadata, make_block_tables

BLOCK_SIZE = 16
NUM_BLOCKS = 40
HEAD_DIM = 32
SEQ_LENS = [1, 15, 17, 100]


def _inputs(num_tokens: int, num_heads: int, num_kv_heads: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen).to(dtype)

    cache_shape = (NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
    # every slot holds finite garbage: context written by "earlier steps" and stale slots the mask must hide
    return (
        rand(num_tokens, num_heads, HEAD_DIM),
        rand(num_tokens, num_kv_heads, HEAD_DIM),
        rand(num_tokens, num_kv_heads, HEAD_DIM),
        rand(*cache_shape) * 3,
        rand(*cache_shape) * 3,
    )


def _check(query_lens, seq_lens, tables, num_heads, num_kv_heads, dtype=torch.float32, atol=1e-5, seed=0):
    meta = make_attention_metadata(query_lens, seq_lens, tables, BLOCK_SIZE)
    q, k, v, k_cache, v_cache = _inputs(sum(query_lens), num_heads, num_kv_heads, dtype, seed)
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

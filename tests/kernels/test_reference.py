"""The oracle itself: the torch twins against hand-computed values and against dense causal attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.reference import (
    dequantize_kv_ref,
    paged_attention_ref,
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    store_kv_ref,
)
from tests.kernels.paged_cases import make_paged_batch


def test_store_kv_ref_writes_slots_and_skips_negative_ones() -> None:
    k_cache = torch.zeros(3, 2, 1, 1)
    v_cache = torch.zeros(3, 2, 1, 1)
    k = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
    store_kv_ref(k, -k, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert k_cache.flatten().tolist() == [3.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert v_cache.flatten().tolist() == [-3.0, 0.0, 0.0, 0.0, 0.0, -1.0]


def test_store_kv_ref_quantizes_rows_into_int8_caches() -> None:
    k_cache = torch.zeros(2, 2, 1, 3, dtype=torch.int8)
    v_cache = torch.zeros(2, 2, 1, 3, dtype=torch.int8)
    k_scale = torch.zeros(2, 2, 1, dtype=torch.float16)
    v_scale = torch.zeros(2, 2, 1, dtype=torch.float16)
    k = 0.125 * torch.tensor([[[127.0, -63.5, 0.5]], [[0.0, 0.0, 0.0]]])  # scale 0.125, then a zero row
    store_kv_ref(k, -k, k_cache, v_cache, torch.tensor([3, 0]), k_scale, v_scale)
    assert k_cache.flatten().tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 0, 127, -63, 1]
    assert v_cache[1, 1, 0].tolist() == [-127, 64, 0]  # floor(x / scale + 0.5): -63.5 -> -63, 63.5 -> 64
    assert k_scale.flatten().tolist() == [0.0, 0.0, 0.0, 0.125]
    assert torch.equal(v_scale, k_scale)
    with pytest.raises(RuntimeError, match="k_scale and v_scale go with int8 caches"):
        store_kv_ref(k, k, k_cache, v_cache, torch.tensor([3, 0]))
    with pytest.raises(RuntimeError, match="k_scale and v_scale go with int8 caches"):
        store_kv_ref(k, k, k_cache.float(), v_cache.float(), torch.tensor([3, 0]), k_scale, v_scale)


def test_paged_attention_ref_on_int8_caches_attends_over_the_dequantized_context() -> None:
    batch = make_paged_batch([1, 17, 40], [1, 17, 9], group=3, kv_cache_dtype=torch.int8).stored()
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)
    out = paged_attention_ref(*args, batch.scale, **batch.kv_scales)
    dequantized = (
        dequantize_kv_ref(batch.k_cache, batch.k_scale),
        dequantize_kv_ref(batch.v_cache, batch.v_scale),
    )
    args = (batch.q, *dequantized, batch.block_tables, batch.query_start_loc, batch.seq_lens)
    assert not out.isnan().any()
    assert torch.equal(out, paged_attention_ref(*args, batch.scale))
    with pytest.raises(RuntimeError, match="k_scale and v_scale go with int8 caches"):
        paged_attention_ref(*args, batch.scale, k_scale=batch.k_scale)


def test_paged_attention_ref_on_hand_computed_values() -> None:
    # one sequence of 3 tokens in blocks [2, 0] (block size 2); queries are the last 2 tokens
    k_cache = torch.zeros(3, 2, 1, 1)
    v_cache = torch.zeros(3, 2, 1, 1)
    k_cache[2, :, 0, 0] = torch.tensor([0.0, 0.0])
    k_cache[0, 0, 0, 0] = 0.0
    v_cache[2, :, 0, 0] = torch.tensor([1.0, 2.0])
    v_cache[0, 0, 0, 0] = 6.0
    v_cache[0, 1, 0, 0] = 100.0  # past the sequence's end: never read
    q = torch.ones(2, 2, 1)  # 2 query heads share the one kv head
    out = paged_attention_ref(
        q, k_cache, v_cache, torch.tensor([[2, 0]]), torch.tensor([0, 2]), torch.tensor([3]), scale=1.0
    )
    # all scores are 0: query at position 1 averages v[0:2], the one at position 2 averages v[0:3]
    assert out.flatten().tolist() == [1.5, 1.5, 3.0, 3.0]


def test_paged_attention_ref_matches_dense_causal_attention() -> None:
    batch = make_paged_batch([1, 17, 40], [1, 17, 9], group=3, block_size=16).stored()
    out = paged_attention_ref(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.seq_lens,
        batch.scale,
    )
    starts = batch.query_start_loc.tolist()
    for i, seq_len in enumerate(batch.seq_lens.tolist()):
        num_blocks = -(-seq_len // 16)
        blocks = batch.block_tables[i, :num_blocks].long()
        key = batch.k_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(3, dim=1).transpose(0, 1)
        value = batch.v_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(3, dim=1).transpose(0, 1)
        query = batch.q[starts[i] : starts[i + 1]].transpose(0, 1)  # [heads, query_len, head_dim]
        query_len = query.shape[1]
        visible = torch.ones(query_len, seq_len, dtype=torch.bool).tril(seq_len - query_len)
        dense = F.scaled_dot_product_attention(query, key, value, attn_mask=visible, scale=batch.scale)
        torch.testing.assert_close(
            out[starts[i] : starts[i + 1]], dense.transpose(0, 1), atol=1e-5, rtol=1e-5
        )


def test_decode_and_prefill_refs_are_cases_of_paged_attention_ref() -> None:
    decode = make_paged_batch([5, 33], group=2).stored()
    general = paged_attention_ref(
        decode.q,
        decode.k_cache,
        decode.v_cache,
        decode.block_tables,
        decode.query_start_loc,
        decode.seq_lens,
        0.3,
    )
    out = torch.empty_like(decode.q)
    result = paged_decode_attention_ref(
        decode.q, decode.k_cache, decode.v_cache, decode.block_tables, decode.seq_lens, 0.3, out
    )
    assert result is out
    assert torch.equal(out, general)
    prefill = make_paged_batch([20, 7], [4, 7]).stored()
    args = (prefill.q, prefill.k_cache, prefill.v_cache, prefill.block_tables, prefill.query_start_loc)
    assert torch.equal(
        paged_prefill_attention_ref(*args, prefill.seq_lens, 0.3, prefill.max_query_len),
        paged_attention_ref(*args, prefill.seq_lens, 0.3),
    )

"""paged_prefill_attention against its torch twin in Triton's interpreter, fp32 and int8 caches, on mixed batches."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_decode import paged_decode_attention
from kernels.paged_prefill import default_tile, paged_prefill_attention
from kernels.reference import paged_prefill_attention_ref
from kernels.runtime import TileConfig
from kernels.store_kv import store_kv
from tests.kernels.paged_cases import INT8_VS_FLOAT_ATOL, INT8_VS_FLOAT_MEAN, PagedBatch, make_paged_batch

pytestmark = pytest.mark.interpreted

ATOL = RTOL = 2e-5  # fp32 in both; they differ only in summation order
# (seq_len, query_len): a 100-token prompt whose first 40 tokens hit the prefix cache (sharing blocks with the
# first sequence), whole prompts of 1, 15 and 17 tokens, the second chunk of a chunked 333-token prompt, a decode
MIXED = [(100, 60), (100, 60), (1, 1), (15, 15), (17, 17), (333, 33), (40, 1)]


def prefill_args(batch: PagedBatch) -> tuple:
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)


def make_mixed_batch(**kwargs) -> PagedBatch:
    seq_lens, query_lens = zip(*MIXED, strict=True)
    return make_paged_batch(list(seq_lens), list(query_lens), **kwargs).stored()


@pytest.mark.parametrize(
    ("group", "head_dim", "block_size"), [(1, 64, 16), (3, 128, 32), (4, 64, 32), (4, 128, 16)]
)
def test_prefill_matches_reference(group: int, head_dim: int, block_size: int) -> None:
    batch = make_mixed_batch(
        group=group, head_dim=head_dim, block_size=block_size, shared_prefix_blocks=32 // block_size
    )
    out = paged_prefill_attention(*prefill_args(batch), batch.scale, batch.max_query_len)
    expected = paged_prefill_attention_ref(*prefill_args(batch), batch.scale, batch.max_query_len)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_prefill_with_small_tiles_spanning_sequences() -> None:
    # 16-row tiles hold 5 tokens x 3 heads: query blocks straddle tile edges and 16-token key tiles split pages
    batch = make_paged_batch([23, 7, 64], [23, 2, 30], group=3, block_size=32).stored()
    out = paged_prefill_attention(
        *prefill_args(batch), batch.scale, 30, tile=TileConfig(block_m=16, tile_n=16)
    )
    expected = paged_prefill_attention_ref(*prefill_args(batch), batch.scale, 30)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_prefill_of_decodes_matches_decode_kernel() -> None:
    batch = make_paged_batch([1, 15, 17, 100], group=4).stored()
    out = paged_prefill_attention(*prefill_args(batch), batch.scale, 1)
    decode = paged_decode_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.scale
    )
    torch.testing.assert_close(out, decode, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(("group", "head_dim", "block_size"), [(1, 64, 16), (3, 128, 32)])
def test_prefill_int8_matches_reference(group: int, head_dim: int, block_size: int) -> None:
    batch = make_mixed_batch(
        group=group, head_dim=head_dim, block_size=block_size, shared_prefix_blocks=32 // block_size,
        kv_cache_dtype=torch.int8,
    )  # fmt: skip
    args = (*prefill_args(batch), batch.scale, batch.max_query_len)
    out = paged_prefill_attention(*args, **batch.kv_scales)
    assert out.dtype == torch.float32 and not out.isnan().any()
    torch.testing.assert_close(
        out, paged_prefill_attention_ref(*args, **batch.kv_scales), atol=ATOL, rtol=RTOL
    )


def test_chunked_prefill_int8_over_blocks_stored_by_the_kernel() -> None:
    # a 75-token prompt in two chunks (40 + 35 tokens), each stored by store_kv and then attended: the second
    # chunk reads the first one's int8 blocks (a partial one included) as cached context
    whole = make_paged_batch([75], [75], group=2, kv_cache_dtype=torch.int8)
    k_cache, v_cache, k_scale, v_scale = (cache.clone() for cache in whole.caches())
    outputs = []
    for start, end in ((0, 40), (40, 75)):
        store_kv(
            whole.k[start:end],
            whole.v[start:end],
            k_cache,
            v_cache,
            whole.slot_mapping[start:end],
            k_scale,
            v_scale,
        )
        outputs.append(
            paged_prefill_attention(
                whole.q[start:end], k_cache, v_cache, whole.block_tables,
                torch.tensor([0, end - start], dtype=torch.int32), torch.tensor([end], dtype=torch.int32),
                whole.scale, end - start, k_scale=k_scale, v_scale=v_scale,
            )
        )  # fmt: skip
    expected = whole.stored()  # the whole prompt stored and attended at once by the twins
    for out, ref in zip((k_cache, v_cache, k_scale, v_scale), expected.caches(), strict=True):
        assert torch.equal(out.nan_to_num(-7.0), ref.nan_to_num(-7.0))
    reference = paged_prefill_attention_ref(*prefill_args(expected), whole.scale, 75, **expected.kv_scales)
    torch.testing.assert_close(torch.cat(outputs), reference, atol=ATOL, rtol=RTOL)


def test_prefill_int8_is_close_to_float() -> None:
    exact = make_mixed_batch(group=3, shared_prefix_blocks=2)
    int8 = make_mixed_batch(group=3, shared_prefix_blocks=2, kv_cache_dtype=torch.int8)
    assert torch.equal(int8.q, exact.q) and int8.k_cache.dtype == torch.int8
    out = paged_prefill_attention(*prefill_args(int8), int8.scale, int8.max_query_len, **int8.kv_scales)
    error = (out - paged_prefill_attention_ref(*prefill_args(exact), exact.scale, exact.max_query_len)).abs()
    assert 1e-4 < error.max() < INT8_VS_FLOAT_ATOL  # see paged_cases.py for the bound
    assert error.mean() < INT8_VS_FLOAT_MEAN


def test_default_tile() -> None:
    assert default_tile(2048, 4, 128) == TileConfig(tile_n=64, block_m=128, num_warps=8)
    assert default_tile(1, 4, 128) == TileConfig(tile_n=64, block_m=16, num_warps=4)
    assert default_tile(5, 3, 64) == TileConfig(tile_n=64, block_m=16, num_warps=4)
    assert default_tile(1, 32, 64) == TileConfig(tile_n=64, block_m=32, num_warps=4)
    assert default_tile(2048, 3, 64) == TileConfig(tile_n=64, block_m=128, num_warps=4)
    assert default_tile(2048, 3, 64, quantized=True) == TileConfig(tile_n=64, block_m=128, num_warps=8)
    assert default_tile(1, 4, 128, quantized=True) == TileConfig(tile_n=64, block_m=16, num_warps=4)


def test_prefill_rejects_bad_inputs() -> None:
    batch = make_paged_batch([20, 7], [4, 7], group=2)
    with pytest.raises(RuntimeError, match="query_start_loc must have 3 entries"):
        paged_prefill_attention(*prefill_args(batch)[:4], batch.query_start_loc[:2], batch.seq_lens, 1.0, 7)
    with pytest.raises(RuntimeError, match="block_m must be a power of two >= 16"):
        paged_prefill_attention(*prefill_args(batch), 1.0, 7, tile=TileConfig(block_m=8))
    int8 = make_paged_batch([20, 7], [4, 7], group=2, kv_cache_dtype=torch.int8)
    with pytest.raises(RuntimeError, match="int8 caches need k_scale and v_scale"):
        paged_prefill_attention(*prefill_args(int8), 1.0, 7)
    with pytest.raises(RuntimeError, match="k_scale must have dtype"):
        paged_prefill_attention(
            *prefill_args(int8), 1.0, 7, k_scale=int8.k_scale.float(), v_scale=int8.v_scale
        )

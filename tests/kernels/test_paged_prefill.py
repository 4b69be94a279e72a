"""paged_prefill_attention against its torch twin in Triton's interpreter, fp32, on mixed ragged batches."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_decode import paged_decode_attention
from kernels.paged_prefill import default_tile, paged_prefill_attention
from kernels.reference import paged_prefill_attention_ref
from kernels.runtime import TileConfig
from tests.kernels.paged_cases import PagedBatch, make_paged_batch

pytestmark = pytest.mark.interpreted

ATOL = RTOL = 2e-5  # fp32 in both; they differ only in summation order
# (seq_len, query_len): a 100-token prompt whose first 40 tokens hit the prefix cache (sharing blocks with the
# first sequence), whole prompts of 1, 15 and 17 tokens, the second chunk of a chunked 333-token prompt, a decode
MIXED = [(100, 60), (100, 60), (1, 1), (15, 15), (17, 17), (333, 33), (40, 1)]


def prefill_args(batch: PagedBatch) -> tuple:
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)


@pytest.mark.parametrize(
    ("group", "head_dim", "block_size"), [(1, 64, 16), (3, 128, 32), (4, 64, 32), (4, 128, 16)]
)
def test_prefill_matches_reference(group: int, head_dim: int, block_size: int) -> None:
    seq_lens, query_lens = zip(*MIXED, strict=True)
    batch = make_paged_batch(
        list(seq_lens), list(query_lens), group=group, head_dim=head_dim, block_size=block_size,
        shared_prefix_blocks=32 // block_size,
    ).stored()  # fmt: skip
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


def test_default_tile() -> None:
    assert default_tile(2048, 4, 128) == TileConfig(tile_n=64, block_m=128, num_warps=8)
    assert default_tile(1, 4, 128) == TileConfig(tile_n=64, block_m=16, num_warps=4)
    assert default_tile(5, 3, 64) == TileConfig(tile_n=64, block_m=16, num_warps=4)
    assert default_tile(1, 32, 64) == TileConfig(tile_n=64, block_m=32, num_warps=4)


def test_prefill_rejects_bad_inputs() -> None:
    batch = make_paged_batch([20, 7], [4, 7], group=2)
    with pytest.raises(RuntimeError, match="query_start_loc must have 3 entries"):
        paged_prefill_attention(*prefill_args(batch)[:4], batch.query_start_loc[:2], batch.seq_lens, 1.0, 7)
    with pytest.raises(RuntimeError, match="block_m must be a power of two >= 16"):
        paged_prefill_attention(*prefill_args(batch), 1.0, 7, tile=TileConfig(block_m=8))

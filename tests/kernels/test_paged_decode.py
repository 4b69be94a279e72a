"""paged_decode_attention (plain and split-K) against its torch twin in Triton's interpreter, fp32 and int8 caches."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_decode import choose_num_splits, paged_decode_attention
from kernels.reference import paged_decode_attention_ref
from kernels.runtime import TileConfig
from tests.kernels.paged_cases import INT8_VS_FLOAT_ATOL, INT8_VS_FLOAT_MEAN, PagedBatch, make_paged_batch

pytestmark = pytest.mark.interpreted

SEQ_LENS = [1, 15, 17, 100, 333]  # ragged: one token, a partial block, one past a block edge, many blocks
ATOL = RTOL = 2e-5  # fp32 in both; they differ only in summation order (and where int8 scales are applied)


def decode_args(batch: PagedBatch) -> tuple:
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.scale)


def decode(batch: PagedBatch, **kwargs) -> torch.Tensor:
    """The kernel's output for the batch, with its caches' scales when int8."""
    return paged_decode_attention(*decode_args(batch), **batch.kv_scales, **kwargs)


@pytest.mark.parametrize(
    ("group", "head_dim", "block_size", "num_splits"),
    [(1, 64, 16, 1), (3, 128, 32, 1), (4, 64, 32, 1), (1, 128, 16, 4), (3, 64, 16, 3), (4, 128, 32, 7)],
)
def test_decode_matches_reference(group: int, head_dim: int, block_size: int, num_splits: int) -> None:
    # sequences 0 and 1 (333 and 100 tokens) share their first 3 blocks, as after a prefix-cache hit
    batch = make_paged_batch(
        [333, 100, 1, 15, 17], group=group, head_dim=head_dim, block_size=block_size, shared_prefix_blocks=3
    ).stored()
    out = paged_decode_attention(*decode_args(batch), num_splits=num_splits)
    expected = paged_decode_attention_ref(*decode_args(batch))
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_decode_tiles_smaller_than_a_block_and_writes_into_out() -> None:
    batch = make_paged_batch(SEQ_LENS, group=2, block_size=32).stored()
    out = torch.full_like(batch.q, 5.0)
    result = paged_decode_attention(*decode_args(batch), out, num_splits=2, tile=TileConfig(tile_n=16))
    assert result is out
    torch.testing.assert_close(out, paged_decode_attention_ref(*decode_args(batch)), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_of_an_empty_context_is_zero(num_splits: int) -> None:
    # a padding row (seq_len 0), as a fixed-size batch may carry; the other rows are unaffected
    batch = make_paged_batch([17, 40], group=2).stored()
    seq_lens = torch.tensor([0, 40], dtype=torch.int32)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, seq_lens, batch.scale)
    out = paged_decode_attention(*args, num_splits=num_splits)
    assert torch.count_nonzero(out[0]) == 0
    torch.testing.assert_close(out, paged_decode_attention_ref(*args), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    ("group", "head_dim", "block_size", "num_splits"), [(1, 64, 16, 1), (4, 128, 32, 1), (3, 64, 16, 3)]
)
def test_decode_int8_matches_reference(group: int, head_dim: int, block_size: int, num_splits: int) -> None:
    batch = make_paged_batch(
        [333, 100, 1, 15, 17], group=group, head_dim=head_dim, block_size=block_size, shared_prefix_blocks=3,
        kv_cache_dtype=torch.int8,
    ).stored()  # fmt: skip
    out = decode(batch, num_splits=num_splits)
    assert out.dtype == torch.float32 and not out.isnan().any()
    torch.testing.assert_close(
        out, paged_decode_attention_ref(*decode_args(batch), **batch.kv_scales), atol=ATOL, rtol=RTOL
    )


@pytest.mark.parametrize("num_splits", [1, 2])
def test_decode_int8_over_a_copied_block_is_identical(num_splits: int) -> None:
    # copy-on-write: the last (partial) block of sequence 0 is copied, values and scales, to a spare block
    batch = make_paged_batch([40, 17], group=2, kv_cache_dtype=torch.int8).stored()
    before = decode(batch, num_splits=num_splits)
    src, dst = int(batch.block_tables[0, 2]), batch.spare_block_ids()[0]
    batch.copy_block(src, dst)
    batch.block_tables[0, 2] = dst
    batch.k_scale[src] = batch.v_scale[src] = float("nan")  # the copy alone must serve
    assert torch.equal(decode(batch, num_splits=num_splits), before)


def test_decode_int8_is_close_to_float() -> None:
    seq_lens = [333, 100, 1, 15, 17]
    exact = make_paged_batch(seq_lens, group=3).stored()
    int8 = make_paged_batch(seq_lens, group=3, kv_cache_dtype=torch.int8).stored()
    assert torch.equal(int8.q, exact.q) and int8.k_cache.dtype == torch.int8
    error = (decode(int8) - paged_decode_attention_ref(*decode_args(exact))).abs()
    assert 1e-4 < error.max() < INT8_VS_FLOAT_ATOL
    assert error.mean() < INT8_VS_FLOAT_MEAN


def test_choose_num_splits() -> None:
    # (num_seqs, num_kv_heads, max_seq_len, num_sms)
    assert choose_num_splits(1, 8, 4096, 132) == 16  # capped by 256 tokens per split
    assert choose_num_splits(4, 8, 32768, 132) == 9  # about two programs per SM
    assert choose_num_splits(1, 1, 100_000, 132) == 64  # MAX_NUM_SPLITS
    assert choose_num_splits(1, 8, 1023, 132) == 1  # short contexts never split
    assert choose_num_splits(32, 8, 4096, 132) == 1  # 256 programs already fill 132 SMs
    assert choose_num_splits(2, 8, 4096, 1) == 1


def test_decode_rejects_bad_inputs() -> None:
    batch = make_paged_batch([17, 40], group=2)
    with pytest.raises(RuntimeError, match="num_splits must be at least 1"):
        paged_decode_attention(*decode_args(batch), num_splits=0)
    with pytest.raises(RuntimeError, match="tile_n must be a power of two >= 16"):
        paged_decode_attention(*decode_args(batch), tile=TileConfig(tile_n=24))
    with pytest.raises(RuntimeError, match="q must have dtype"):
        paged_decode_attention(batch.q.double(), *decode_args(batch)[1:])
    with pytest.raises(RuntimeError, match="block_tables .* must have 2 rows"):
        paged_decode_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.block_tables[:1], batch.seq_lens, 1.0
        )
    with pytest.raises(RuntimeError, match="only for int8 caches"):
        paged_decode_attention(
            *decode_args(batch), k_scale=batch.k_cache[..., 0], v_scale=batch.v_cache[..., 0]
        )


def test_decode_int8_rejects_missing_or_mismatched_scales() -> None:
    batch = make_paged_batch([17, 40], group=2, kv_cache_dtype=torch.int8)
    with pytest.raises(RuntimeError, match="int8 caches need k_scale and v_scale"):
        paged_decode_attention(*decode_args(batch))
    with pytest.raises(RuntimeError, match="int8 caches need k_scale and v_scale"):
        paged_decode_attention(*decode_args(batch), v_scale=batch.v_scale)
    with pytest.raises(RuntimeError, match="k_scale must be on"):
        paged_decode_attention(*decode_args(batch), k_scale=batch.k_scale.to("meta"), v_scale=batch.v_scale)
    with pytest.raises(RuntimeError, match=r"v_scale must be \[num_blocks, block_size, num_kv_heads\]"):
        paged_decode_attention(*decode_args(batch), k_scale=batch.k_scale, v_scale=batch.v_scale[:, :, :1])
    with pytest.raises(RuntimeError, match="q must have dtype"):
        paged_decode_attention(batch.q.to(torch.int8), *decode_args(batch)[1:], **batch.kv_scales)

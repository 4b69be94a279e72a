"""The kernel-vs-twin comparisons compiled natively on CUDA, in fp32 (tf32 dots) and bf16, at model-like sizes,
over float caches (q's dtype) and int8 caches with fp16 scales.

Runs only where CUDA is available and TRITON_INTERPRET is unset (see conftest.py): `pytest -m cuda tests/kernels`.
"""

from __future__ import annotations

import pytest
import torch

from engine.attention.triton_backend import TritonAttentionBackend
from kernels.paged_decode import choose_num_splits, num_sms, paged_decode_attention
from kernels.paged_prefill import paged_prefill_attention
from kernels.reference import paged_attention_ref, paged_decode_attention_ref, paged_prefill_attention_ref
from kernels.store_kv import store_kv
from tests.kernels.paged_cases import INT8_VS_FLOAT_ATOL, PagedBatch, make_paged_batch
from tests.kernels.test_attention_backend import make_metadata

pytestmark = pytest.mark.cuda

# fp32 inputs go through tl.dot as tf32 (10-bit mantissa); bf16 outputs and probabilities round to 8 bits
TOLERANCE = {torch.float32: 1e-2, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(8, 4, 128, 16), (3, 3, 64, 32), (2, 1, 128, 32)]  # (num_kv_heads, group, head_dim, block_size)
KV_CACHE_DTYPES = pytest.mark.parametrize("kv_cache_dtype", [None, torch.int8], ids=["float", "int8"])


def make_batch(
    seq_lens: list[int],
    query_lens: list[int] | None,
    dtype: torch.dtype,
    shape: tuple,
    kv_cache_dtype: torch.dtype | None = None,
) -> PagedBatch:
    num_kv_heads, group, head_dim, block_size = shape
    return make_paged_batch(
        seq_lens, query_lens, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, block_size=block_size,
        shared_prefix_blocks=2, dtype=dtype, kv_cache_dtype=kv_cache_dtype, device="cuda",
    )  # fmt: skip


def assert_caches_equal(batch: PagedBatch, expected: PagedBatch) -> None:
    """Bit-for-bit equal caches (values and int8 scales); NaN marks slots never written."""
    for cache, expected_cache in zip(batch.caches(), expected.caches(), strict=True):
        assert torch.equal(cache.nan_to_num(-7.0), expected_cache.nan_to_num(-7.0))


def assert_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert not out.isnan().any()
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@KV_CACHE_DTYPES
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_cuda(dtype: torch.dtype, kv_cache_dtype: torch.dtype | None) -> None:
    # int8: the kernel's IEEE divisions (div_rn) make the quantization match the twin's bit for bit on CUDA too
    batch = make_batch([333, 100, 17], [33, 60, 17], dtype, SHAPES[0], kv_cache_dtype)
    expected = batch.stored()
    store_kv(batch.k, batch.v, batch.k_cache, batch.v_cache, batch.slot_mapping, batch.k_scale, batch.v_scale)
    assert_caches_equal(batch, expected)


@KV_CACHE_DTYPES
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 5])
def test_decode_cuda(
    shape: tuple, dtype: torch.dtype, num_splits: int, kv_cache_dtype: torch.dtype | None
) -> None:
    batch = make_batch([2000, 333, 1, 15, 17, 100, 1024], None, dtype, shape, kv_cache_dtype).stored()
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.scale)
    out = paged_decode_attention(*args, num_splits=num_splits, **batch.kv_scales)
    assert_close(out, paged_decode_attention_ref(*args, **batch.kv_scales))


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_cuda_int8_is_close_to_float(dtype: torch.dtype) -> None:
    seq_lens = [2000, 333, 1, 15, 17, 100, 1024]
    exact = make_batch(seq_lens, None, dtype, SHAPES[0]).stored()
    int8 = make_batch(seq_lens, None, dtype, SHAPES[0], torch.int8).stored()
    args = (int8.q, int8.k_cache, int8.v_cache, int8.block_tables, int8.seq_lens, int8.scale)
    out = paged_decode_attention(*args, **int8.kv_scales).float()
    expected = paged_decode_attention_ref(
        exact.q, exact.k_cache, exact.v_cache, exact.block_tables, exact.seq_lens, exact.scale
    ).float()
    # the quantization error (see paged_cases.py) plus the kernels' own dtype tolerance
    torch.testing.assert_close(
        out, expected, atol=INT8_VS_FLOAT_ATOL + TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_cuda_heuristic_splits_few_long_sequences(dtype: torch.dtype) -> None:
    batch = make_batch([3000, 1500], None, dtype, SHAPES[0]).stored()
    max_seq_len = batch.block_tables.shape[1] * 16
    assert choose_num_splits(2, 8, max_seq_len, num_sms(batch.q.device)) > 1
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.scale)
    assert_close(paged_decode_attention(*args), paged_decode_attention_ref(*args))


@KV_CACHE_DTYPES
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_cuda(shape: tuple, dtype: torch.dtype, kv_cache_dtype: torch.dtype | None) -> None:
    # a prefix hit, whole prompts, the second chunk of a chunked prompt, decodes
    seq_lens, query_lens = [700, 300, 1, 15, 17, 1333, 40, 41], [600, 200, 1, 15, 17, 333, 1, 1]
    batch = make_batch(seq_lens, query_lens, dtype, shape, kv_cache_dtype).stored()
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)
    expected = paged_prefill_attention_ref(*args, batch.scale, batch.max_query_len, **batch.kv_scales)
    assert_close(
        paged_prefill_attention(*args, batch.scale, batch.max_query_len, **batch.kv_scales), expected
    )


@KV_CACHE_DTYPES
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 64, 17]], ids=["decode", "mixed"])
def test_backend_cuda(query_lens: list[int], kv_cache_dtype: torch.dtype | None) -> None:
    batch = make_batch([100, 200, 40], query_lens, torch.bfloat16, SHAPES[0], kv_cache_dtype)
    expected = batch.stored()
    out = TritonAttentionBackend().forward(
        batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, make_metadata(batch), batch.scale,
        batch.k_scale, batch.v_scale,
    )  # fmt: skip
    assert_caches_equal(batch, expected)
    reference = paged_attention_ref(
        batch.q, expected.k_cache, expected.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens,
        batch.scale, **expected.kv_scales,
    )  # fmt: skip
    assert_close(out, reference)

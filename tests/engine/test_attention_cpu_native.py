"""The compiled CPU decode kernel equals the reference on ragged, GQA, strided and partial-row batches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.core.utils import cdiv
from engine.native import attention as attention_cpu_native
from engine.native.attention import load_kernel
from kernels.reference import dequantize_kv_ref, paged_attention_ref, store_kv_ref
from tests.engine.factories import (
    ATTENTION_MARCHES,
    attention_kernel,
    fp32_attention_tol,
    make_attention_metadata,
    make_block_tables,
)
from tests.engine.test_attention_int8 import _int8_pool

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(
    KERNEL is None, reason="no C compiler: the native kernel cannot be built here"
)
SEQ_LENS = [1, 15, 16, 17, 100, 250]  # one token, block boundaries, several chunks of 16
BF16_TOL = dict(atol=1e-2, rtol=2**-7)  # one bf16 rounding of outputs up to ~10 (both sides round once)
FP32_TOL = fp32_attention_tol(
    64
)  # tiny blocks: one online-softmax merge every 4 tokens, each adding rounding


def _caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, gen):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return (torch.randn(shape, generator=gen) * 3).to(dtype), (torch.randn(shape, generator=gen) * 3).to(
        dtype
    )


def _reference(q, k_cache, v_cache, tables, rows, seq_lens, scale):
    """paged_attention_ref over the decoding rows only, one query token each."""
    starts = torch.arange(len(rows) + 1, dtype=torch.int32)
    return paged_attention_ref(
        q[rows].float(), k_cache.float(), v_cache.float(), tables, starts, seq_lens, scale
    )


@pytest.mark.parametrize(
    "dtype,head_dim,num_heads,num_kv_heads,block_size",
    [
        (torch.float32, 32, 6, 2, 16),
        (torch.float32, 16, 4, 4, 8),
        (
            torch.float32,
            64,
            8,
            2,
            16,
        ),  # Llama-3.2-1B's, -3B's and -3.1-8B's specialised copies (AVX2; AVX-512: fp16
        (torch.float32, 128, 6, 2, 16),  # and int8 caches, test_attention_fp16kv / _int8)
        (torch.float32, 128, 8, 2, 16),
        (torch.float32, 48, 7, 1, 32),
        (torch.bfloat16, 64, 9, 3, 16),  # SmolLM2's specialised copy
        (torch.bfloat16, 64, 8, 2, 16),
        (torch.bfloat16, 128, 8, 2, 16),
        (torch.bfloat16, 80, 10, 5, 128),
        (torch.float32, 64, 9, 3, 4),  # blocks shorter than a chunk
        (torch.bfloat16, 32, 4, 2, 24),  # a block size that is no multiple of 16
    ],
)
@pytest.mark.parametrize("march", ATTENTION_MARCHES)
def test_decode_matches_reference(dtype, head_dim, num_heads, num_kv_heads, block_size, march):
    gen = torch.Generator().manual_seed(head_dim + num_heads)
    num_blocks = sum(cdiv(n, block_size) for n in SEQ_LENS) + 3
    width = cdiv(max(SEQ_LENS), block_size)
    tables = torch.tensor(
        [t + [0] * (width - len(t)) for t in make_block_tables(SEQ_LENS, block_size, num_blocks, seed=1)],
        dtype=torch.int32,
    )
    k_cache, v_cache = _caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, gen)
    q = torch.randn(len(SEQ_LENS), num_heads, head_dim, generator=gen).to(dtype)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    rows = torch.arange(len(SEQ_LENS), dtype=torch.int32)
    out = torch.empty_like(q)
    attention_kernel(march)(q, k_cache, v_cache, rows, seq_lens, tables, out, 0.3)
    expected = _reference(q, k_cache, v_cache, tables, rows.long(), seq_lens, 0.3)
    tol = fp32_attention_tol(head_dim) if dtype == torch.float32 else BF16_TOL
    torch.testing.assert_close(out.float(), expected.float(), **tol)


def test_strided_query_and_scattered_rows_leave_other_rows_alone():
    # q is a view into a fused qkv row (as the model passes it); only rows 4 and 1 decode
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = _caches(20, 16, 2, 32, torch.float32, gen)
    qkv = torch.randn(6, 8 + 2 * 2, 32, generator=gen)
    q = qkv[:, :8]
    tables = torch.tensor([[3, 7, 11], [0, 19, 2]], dtype=torch.int32)
    seq_lens = torch.tensor([40, 33], dtype=torch.int32)
    rows = torch.tensor([4, 1], dtype=torch.int32)
    out = torch.full((6, 8, 32), 7.0)
    KERNEL(q, k_cache, v_cache, rows, seq_lens, tables, out, 32**-0.5)
    expected = _reference(q, k_cache, v_cache, tables, rows.long(), seq_lens, 32**-0.5)
    torch.testing.assert_close(out[rows.long()], expected, atol=1e-5, rtol=0)
    untouched = [0, 2, 3, 5]
    assert torch.equal(out[untouched], torch.full((4, 8, 32), 7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_store_kv_matches_reference_with_strided_rows_and_padding(dtype):
    gen = torch.Generator().manual_seed(8)
    k_cache, v_cache = _caches(12, 16, 2, 32, dtype, gen)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(5, 4 + 2 + 2, 32, generator=gen).to(dtype)  # k and v are views into fused rows
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor([3, 191, -1, 16 * 7 + 15, 40], dtype=torch.int64)  # first/last slots, a padding row
    assert KERNEL.can_store(k, v, k_cache, v_cache)
    KERNEL.store_kv(k, v, k_cache, v_cache, slots)
    store_kv_ref(k, v, expected_k, expected_v, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    assert not KERNEL.can_store(k.float() if dtype != torch.float32 else k.half(), v, k_cache, v_cache)


def test_supports_only_what_the_kernel_handles():
    cache = torch.zeros(4, 16, 2, 64)
    assert KERNEL.supports(torch.zeros(3, 6, 64), cache)
    assert not KERNEL.supports(torch.zeros(3, 6, 64, dtype=torch.float16), cache.half())
    assert not KERNEL.supports(
        torch.zeros(3, 6, 24), torch.zeros(4, 16, 2, 24)
    )  # head_dim not a multiple of 16
    assert not KERNEL.supports(torch.zeros(3, 34, 64), cache)  # 17 query heads per kv head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_native_and_torch_paths_agree_on_mixed_steps(dtype):
    # decodes interleaved with a chunked prefill and a fresh prefill: the kernel takes rows 0, 4, 6
    seq_lens, query_lens = [37, 60, 1, 18, 90], [1, 3, 1, 18, 1]
    tables = make_block_tables(seq_lens, 16, 40, seed=2)
    meta = make_attention_metadata(query_lens, seq_lens, tables, 16)
    gen = torch.Generator().manual_seed(4)
    num_tokens = sum(query_lens)
    q, k, v = (torch.randn(num_tokens, h, 32, generator=gen).to(dtype) for h in (6, 2, 2))
    results = []
    for native in (True, False):
        k_cache, v_cache = _caches(40, 16, 2, 32, dtype, torch.Generator().manual_seed(5))
        backend = TorchAttentionBackend(16, native=native)
        backend.prepare(meta)
        results.append(backend.forward(q, k, v, k_cache, v_cache, meta, 0.25))
        expected = paged_attention_ref(
            q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.25
        )
        tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
        torch.testing.assert_close(results[-1].float(), expected.float(), **tol)
    assert backend.kernel is None and TorchAttentionBackend(16, native=True).kernel is KERNEL


def test_unsupported_dtype_falls_back_to_torch():
    seq_lens = [5, 20]
    meta = make_attention_metadata([1, 1], seq_lens, make_block_tables(seq_lens, 16, 8, seed=0), 16)
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, h, 32, generator=gen).half() for h in (4, 2, 2))
    k_cache, v_cache = _caches(8, 16, 2, 32, torch.float16, gen)
    out = TorchAttentionBackend(16).forward(q, k, v, k_cache, v_cache, meta, 0.5)
    expected = paged_attention_ref(
        q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.5
    )
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=0)


@pytest.mark.parametrize("past", ["block", "slot"])
def test_metadata_past_the_pool_raises_instead_of_reading_out_of_bounds(past):
    seq_lens = [20, 5]
    tables = [[1, 9 if past == "block" else 2], [3]]  # a pool of 8 blocks: block 9 does not exist
    meta = make_attention_metadata([1, 1], seq_lens, tables, 16)
    if past == "slot":  # a slot mapping that points past the pool while the tables stay in range
        slots = torch.tensor([8 * 16, 3 * 16 + 4])  # and no host copy of the reach: read from the tensors
        meta = dataclasses.replace(meta, slot_mapping=slots, host_reach=None)
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, h, 32, generator=gen) for h in (4, 2, 2))
    k_cache, v_cache = _caches(8, 16, 2, 32, torch.float32, gen)
    with pytest.raises(RuntimeError, match="past a pool of 8 blocks"):
        TorchAttentionBackend(16, native=True).forward(q, k, v, k_cache, v_cache, meta, 0.5)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv(attention_cpu_native.DISABLE_ENV, "0")
    assert load_kernel() is None
    assert TorchAttentionBackend(16).kernel is None
    with pytest.raises(RuntimeError, match="native CPU attention was required"):
        TorchAttentionBackend(16, native=True)


@pytest.mark.parametrize("kv_int8", [False, True])
@pytest.mark.parametrize(
    "seq_lens,threads,block_size",
    [
        ([600], 2, 16),  # one conversation on two threads: three pieces of 256 tokens, the last one short
        ([130], 3, 16),  # one piece
        ([256, 257], 4, 16),  # a piece exactly, and one token more: a second piece of one token
        ([300, 140, 900], 4, 32),  # the shorter sequences' later pieces are empty
        (
            [1000, 1001, 1002],
            2,
            16,
        ),  # a sequence's consecutive positions, as speculative decoding verifies them
    ],
)
def test_decode_rows_are_the_same_bits_in_any_batch_and_on_any_thread_count(
    seq_lens, threads, block_size, kv_int8
):
    """Each context is cut into pieces of PIECE_TOKENS whatever the batch, one work item a piece, and their softmax
    states are merged in order: the reference's result (fp32 tolerance), and for each row the very bits of decoding
    it alone on one thread (issue #40: a sequence's proposed tokens are extra decode rows of its step)."""

    head_dim, num_heads, num_kv_heads = 64, 9, 3  # SmolLM2's shape
    num_blocks = sum(cdiv(n, block_size) for n in seq_lens) + 2
    width = cdiv(max(seq_lens), block_size)
    tables = torch.tensor(
        [t + [0] * (width - len(t)) for t in make_block_tables(seq_lens, block_size, num_blocks, seed=2)],
        dtype=torch.int32,
    )
    gen = torch.Generator().manual_seed(len(seq_lens) + threads)
    if kv_int8:
        k_cache, v_cache, k_scale, v_scale = _int8_pool(
            num_blocks, block_size, num_kv_heads, head_dim, seed=7
        )
        scales = (k_scale, v_scale)
        k_read = dequantize_kv_ref(k_cache, k_scale)
        v_read = dequantize_kv_ref(v_cache, v_scale)
    else:
        k_cache, v_cache = _caches(num_blocks, block_size, num_kv_heads, head_dim, torch.float32, gen)
        scales, k_read, v_read = (), k_cache, v_cache
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=gen)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    rows = torch.arange(len(seq_lens), dtype=torch.int32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        together = torch.full_like(q, float("nan"))
        KERNEL(q, k_cache, v_cache, rows, seq_lens_t, tables, together, 0.125, *scales)
        torch.set_num_threads(1)
        alone = torch.full_like(q, float("nan"))
        for i in range(len(seq_lens)):
            KERNEL(
                q,
                k_cache,
                v_cache,
                rows[i : i + 1],
                seq_lens_t[i : i + 1],
                tables[i : i + 1],
                alone,
                0.125,
                *scales,
            )
    finally:
        torch.set_num_threads(before)
    expected = _reference(q, k_read, v_read, tables, rows.long(), seq_lens_t, 0.125)
    torch.testing.assert_close(together, expected.float(), **FP32_TOL)
    assert torch.equal(together, alone)

"""An int8 KV pool on the CPU: the native store quantizes exactly as the twin (kernels/reference.py), native decode
and the torch paths (decode groups, prefill over cached int8 blocks) equal attention over the dequantized pool."""

from __future__ import annotations

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.core.utils import cdiv
from engine.native.attention import load_kernel
from kernels.reference import dequantize_kv_ref, paged_attention_ref, quantize_kv_ref, store_kv_ref
from tests.engine.factories import (
    ATTENTION_MARCHES,
    attention_kernel,
    make_attention_metadata,
    make_block_tables,
)

KERNEL = load_kernel()
native = pytest.mark.skipif(KERNEL is None, reason="no C compiler: the native kernel cannot be built here")
FP32_TOL = dict(atol=2e-5, rtol=0)
BF16_TOL = dict(atol=1e-2, rtol=2**-7)


def _int8_pool(num_blocks, block_size, num_kv_heads, head_dim, seed):
    """Random int8 K/V with random positive fp16 scales: (k, v, k_scale, v_scale)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    values = [torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8) for _ in range(2)]
    scales = [(torch.rand(shape[:3], generator=gen) * 0.05 + 1e-3).half() for _ in range(2)]
    return values[0], values[1], scales[0], scales[1]


def _expected(q, pool, meta, scale, read_as=torch.float32):
    """Attention over the dequantized pool, its values rounded to `read_as` on the way (the torch path reads them in
    q's dtype, the native kernel in fp32)."""
    k, v, ks, vs = pool
    k, v = (dequantize_kv_ref(x, s).to(read_as).float() for x, s in ((k, ks), (v, vs)))
    return paged_attention_ref(q.float(), k, v, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale)


def test_quantize_twin_round_trip_and_edge_rows():
    x = torch.randn(50, 3, 64) * 4
    x[3, 1] = 0.0  # an all-zero row: scale 0, values 0
    x[7, 0, 5] = 1e6  # one huge value: the rest of its row rounds to 0
    q, s = quantize_kv_ref(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float16 and s.shape == (50, 3)
    assert q.abs().max() <= 127 and s[3, 1] == 0 and not q[3, 1].any()
    err = (dequantize_kv_ref(q, s) - x).abs()
    bound = (
        x.abs().amax(-1, keepdim=True) / 254 * (1 + 2**-10) + 1e-6
    )  # half a step, the scale's fp16 rounding
    assert (err <= bound).all()


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_store_quantizes_bit_for_bit_like_the_twin(dtype):
    gen = torch.Generator().manual_seed(1)
    pool = _int8_pool(12, 16, 2, 32, seed=2)
    expected = [t.clone() for t in pool]
    qkv = (torch.randn(6, 4 + 2 + 2, 32, generator=gen) * 3).to(dtype)  # k and v: views into fused rows
    qkv[2, 5] = 0.0  # a zero row of v
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor(
        [3, 191, -1, 16 * 7 + 15, 40, 41], dtype=torch.int64
    )  # first/last slots, a padding row
    assert KERNEL.can_store(k, v, pool[0], pool[1])
    KERNEL.store_kv(k, v, pool[0], pool[1], slots, pool[2], pool[3])
    store_kv_ref(k, v, expected[0], expected[1], slots, expected[2], expected[3])
    for got, want in zip(pool, expected, strict=True):
        assert torch.equal(got, want)
    assert not KERNEL.can_store(k.half(), v.half(), pool[0], pool[1])  # fp16 activations: the torch path


@native
@pytest.mark.parametrize(
    "dtype,head_dim,num_heads,num_kv_heads,block_size",
    [
        (torch.float32, 64, 9, 3, 16),  # SmolLM2's specialised copy
        (torch.float32, 64, 8, 2, 16),  # Llama-3.2-1B's, -3B's and -3.1-8B's
        (torch.float32, 128, 6, 2, 16),
        (torch.bfloat16, 128, 8, 2, 16),
        (torch.float32, 32, 6, 2, 16),
        (torch.float32, 48, 7, 1, 32),
        (torch.bfloat16, 64, 9, 3, 16),
        (torch.bfloat16, 128, 8, 2, 8),
        (torch.float32, 64, 9, 3, 4),  # blocks shorter than a chunk
        (torch.float32, 32, 4, 2, 24),  # chunks of 8 that end at each block's end
    ],
)
@pytest.mark.parametrize("march", ATTENTION_MARCHES)
def test_native_decode_over_int8_equals_attention_over_the_dequantized_pool(
    dtype, head_dim, num_heads, num_kv_heads, block_size, march
):
    seq_lens = [1, 15, 16, 17, 100, 250]
    num_blocks = sum(cdiv(n, block_size) for n in seq_lens) + 3
    tables = make_block_tables(seq_lens, block_size, num_blocks, seed=3)
    meta = make_attention_metadata([1] * len(seq_lens), seq_lens, tables, block_size)
    pool = _int8_pool(num_blocks, block_size, num_kv_heads, head_dim, seed=head_dim)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(4)).to(dtype)
    out = torch.empty_like(q)
    rows = torch.arange(len(seq_lens), dtype=torch.int32)
    attention_kernel(march)(
        q, pool[0], pool[1], rows, meta.seq_lens, meta.block_tables, out, 0.3, pool[2], pool[3]
    )
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    torch.testing.assert_close(out.float(), _expected(q, pool, meta, 0.3), **tol)


@pytest.mark.parametrize("use_native", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_stores_then_attends_a_mixed_step_over_int8(use_native, dtype):
    """Decodes, a chunked prefill over cached int8 blocks and a fresh prefill, native and torch-twin paths alike."""
    if use_native and KERNEL is None:
        pytest.skip("no C compiler")
    seq_lens, query_lens = [37, 60, 1, 18, 90], [1, 3, 1, 18, 1]
    tables = make_block_tables(seq_lens, 16, 40, seed=2)
    meta = make_attention_metadata(query_lens, seq_lens, tables, 16)
    gen = torch.Generator().manual_seed(4)
    num_tokens = sum(query_lens)
    q, k, v = ((torch.randn(num_tokens, h, 32, generator=gen) * 2).to(dtype) for h in (6, 2, 2))
    pool = _int8_pool(40, 16, 2, 32, seed=5)
    backend = TorchAttentionBackend(16, native=use_native)
    backend.prepare(meta)
    out = backend.forward(q, k, v, pool[0], pool[1], meta, 0.25, pool[2], pool[3])
    # the step's own K/V were quantized into the pool first, and every query (the fresh prefill's too) reads them
    stored, scales = quantize_kv_ref(k)
    assert torch.equal(pool[0].view(-1, 2, 32)[meta.slot_mapping], stored)
    assert torch.equal(pool[2].view(-1, 2)[meta.slot_mapping], scales)
    expected = _expected(q, pool, meta, 0.25, read_as=dtype)
    if use_native:  # the decode rows come from the kernel, which reads the pool in fp32
        ends = meta.query_start_loc[1:].tolist()
        decode_rows = [end - 1 for end, n in zip(ends, query_lens, strict=True) if n == 1]
        expected[decode_rows] = _expected(q, pool, meta, 0.25)[decode_rows]
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    torch.testing.assert_close(out.float(), expected, **tol)


def test_a_copied_block_with_its_scales_attends_like_the_original():
    pool = _int8_pool(8, 16, 2, 32, seed=9)
    for t in pool:  # copy-on-write: values and scales of block 2 into block 6
        t[6] = t[2]
    q = torch.randn(2, 4, 32)
    meta = make_attention_metadata([1, 1], [30, 30], [[2, 4], [6, 4]], 16)
    out = TorchAttentionBackend(16).forward(q[[0, 0]], q[:, :2], q[:, :2], *pool[:2], meta, 0.3, *pool[2:])
    assert torch.equal(out[0], out[1])


def test_int8_caches_need_their_scales_and_float_caches_take_none():
    meta = make_attention_metadata([1], [5], [[0]], 16)
    k, v, ks, vs = _int8_pool(2, 16, 2, 32, seed=1)
    q = torch.randn(1, 4, 32)
    backend = TorchAttentionBackend(16)
    with pytest.raises(RuntimeError, match="need k_scale and v_scale"):
        backend.forward(q, q[:, :2], q[:, :2], k, v, meta, 0.3)
    with pytest.raises(RuntimeError, match="take no k_scale"):
        backend.forward(q, q[:, :2], q[:, :2], k.float(), v.float(), meta, 0.3, ks, vs)

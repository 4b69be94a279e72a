"""An fp16 KV pool under fp32 activations (kv_cache_dtype float16): the rows are rounded to fp16 as torch rounds
them, the CPU kernel and the torch twin attend over exactly those values, and prefills read them back from the
pool, so a prompt sees the same K/V however its steps were cut."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.torch_backend import TorchAttentionBackend
from engine.core.utils import cdiv
from engine.native.attention import load_kernel
from engine.worker.device import cpu_has_fast_bf16
from kernels.reference import paged_attention_ref
from tests.engine.factories import (
    ATTENTION_MARCHES,
    attention_kernel,
    fp32_attention_tol,
    make_attention_metadata,
    make_block_tables,
)
from tests.engine.gguf_factories import write_tiny_chat_gguf

KERNEL = load_kernel()
needs_kernel = pytest.mark.skipif(
    KERNEL is None, reason="no C compiler: the native kernel cannot be built here"
)
# the kernel's fp32 arithmetic against the reference's, over the same values
FP32_TOL = fp32_attention_tol(64)
SEQ_LENS = [1, 15, 16, 17, 100, 250]


def _fp16_caches(num_blocks, block_size, num_kv_heads, head_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return tuple((torch.randn(shape, generator=gen) * 3).half() for _ in range(2))


def _tables(seq_lens, block_size, num_blocks):
    width = cdiv(max(seq_lens), block_size)
    return torch.tensor(
        [t + [0] * (width - len(t)) for t in make_block_tables(seq_lens, block_size, num_blocks, seed=1)],
        dtype=torch.int32,
    )


@needs_kernel
@pytest.mark.parametrize(
    "head_dim,num_heads,num_kv_heads,block_size",
    [
        (64, 9, 3, 16),
        (64, 8, 2, 16),
        (128, 6, 2, 16),
        (128, 8, 2, 16),
        (32, 6, 2, 16),
        (48, 7, 1, 32),
        (64, 9, 3, 4),
        (32, 4, 2, 24),
    ],
    ids=["smollm2", "llama-1b", "llama-3b", "llama-8b", "gqa", "mqa", "short-blocks", "block-24"],
)
@pytest.mark.parametrize("march", ATTENTION_MARCHES)
def test_native_decode_over_fp16_caches_equals_attention_over_their_values(
    head_dim, num_heads, num_kv_heads, block_size, march
):
    num_blocks = sum(cdiv(n, block_size) for n in SEQ_LENS) + 3
    tables = _tables(SEQ_LENS, block_size, num_blocks)
    k_cache, v_cache = _fp16_caches(num_blocks, block_size, num_kv_heads, head_dim, seed=head_dim)
    q = torch.randn(len(SEQ_LENS), num_heads, head_dim, generator=torch.Generator().manual_seed(2))
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    rows = torch.arange(len(SEQ_LENS), dtype=torch.int32)
    kernel = attention_kernel(march)
    assert kernel.supports(q, k_cache)
    out = torch.full_like(q, float("nan"))
    kernel(q, k_cache, v_cache, rows, seq_lens, tables, out, 0.3)
    starts = torch.arange(len(SEQ_LENS) + 1, dtype=torch.int32)
    expected = paged_attention_ref(q, k_cache.float(), v_cache.float(), tables, starts, seq_lens, 0.3)
    torch.testing.assert_close(out, expected, **fp32_attention_tol(head_dim))


@needs_kernel
@pytest.mark.parametrize("seq_lens,threads", [([600], 2), ([130], 3), ([300, 140], 4)])
def test_one_conversation_split_between_threads_reads_fp16_caches_alike(seq_lens, threads):
    """Fewer sequences than threads: the split kernel (pieces of the context, merged softmax states)."""
    num_blocks = sum(cdiv(n, 16) for n in seq_lens) + 2
    tables = _tables(seq_lens, 16, num_blocks)
    k_cache, v_cache = _fp16_caches(num_blocks, 16, 3, 64, seed=5)
    q = torch.randn(len(seq_lens), 9, 64, generator=torch.Generator().manual_seed(6))
    seq_lens_t, rows = (
        torch.tensor(seq_lens, dtype=torch.int32),
        torch.arange(len(seq_lens), dtype=torch.int32),
    )
    outs, before = {}, torch.get_num_threads()
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            outs[n] = torch.full_like(q, float("nan"))
            KERNEL(q, k_cache, v_cache, rows, seq_lens_t, tables, outs[n], 0.125)
    finally:
        torch.set_num_threads(before)
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    expected = paged_attention_ref(q, k_cache.float(), v_cache.float(), tables, starts, seq_lens_t, 0.125)
    torch.testing.assert_close(outs[threads], expected, **FP32_TOL)
    torch.testing.assert_close(outs[threads], outs[1], atol=2e-6, rtol=2e-6)


@needs_kernel
def test_store_rounds_fp32_rows_into_fp16_caches_as_torch_does():
    k_cache, v_cache = (torch.zeros(12, 16, 2, 32, dtype=torch.float16) for _ in range(2))
    qkv = torch.randn(5, 8, 32, generator=torch.Generator().manual_seed(8)) * 100
    qkv[0, 4, :4] = torch.tensor([65504.0, 1e-8, -3.0e-5, 2049.0])  # fp16's max, a subnormal, a tie to even
    qkv[1, 6, 30:] = torch.tensor([1e6, -7e4])  # beyond fp16's range: saturated at +-65504, not infinite
    k, v = qkv[:, 4:6], qkv[:, 6:8]  # views into fused rows, as the model passes them
    slots = torch.tensor([3, 191, -1, 16 * 7 + 15, 40], dtype=torch.int64)  # first/last slots, a padding row
    assert KERNEL.can_store(k, v, k_cache, v_cache)
    assert not KERNEL.can_store(k.bfloat16(), v.bfloat16(), k_cache, v_cache)
    KERNEL.store_kv(k, v, k_cache, v_cache, slots)
    keep = slots >= 0
    flat_k, flat_v = k_cache.view(-1, 2, 32), v_cache.view(-1, 2, 32)
    fp16 = lambda x: x.clamp(-65504, 65504).half()  # noqa: E731
    assert torch.equal(flat_k[slots[keep]], fp16(k[keep])) and torch.equal(flat_v[slots[keep]], fp16(v[keep]))
    assert flat_v[slots[1], 0, 30:].tolist() == [65504.0, -65504.0]
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots[keep]] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


@needs_kernel
def test_bf16_queries_over_fp16_caches_are_not_the_kernels():
    cache = torch.zeros(4, 16, 2, 64, dtype=torch.float16)
    assert KERNEL.supports(torch.zeros(3, 6, 64), cache)
    assert not KERNEL.supports(torch.zeros(3, 6, 64, dtype=torch.bfloat16), cache)


@pytest.mark.parametrize("native", [True, False], ids=["kernel", "torch"])
def test_a_mixed_step_attends_over_the_pools_rounded_values(native):
    """Decodes, a chunk of a cached prompt and a fresh prompt in one step: every row attends over the fp16 values
    the pool holds, this step's own K/V included (the fresh prompt too, as if it had come in chunks)."""
    if native and KERNEL is None:
        pytest.skip("no C compiler: the native kernel cannot be built here")
    seq_lens, query_lens = [37, 60, 1, 18, 90], [1, 3, 1, 18, 1]
    tables = make_block_tables(seq_lens, 16, 40, seed=2)
    meta = make_attention_metadata(query_lens, seq_lens, tables, 16)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(sum(query_lens), h, 32, generator=gen) * 3 for h in (6, 2, 2))
    v[5, 1, :2] = torch.tensor([1e6, -1e6])  # beyond fp16: both stores saturate
    k_cache, v_cache = _fp16_caches(40, 16, 2, 32, seed=5)
    backend = TorchAttentionBackend(16, native=native)
    backend.prepare(meta)
    out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
    assert torch.equal(k_cache.view(-1, 2, 32)[meta.slot_mapping], k.half())
    assert torch.equal(v_cache.view(-1, 2, 32)[meta.slot_mapping], v.clamp(-65504, 65504).half())
    assert out.isfinite().all()
    expected = paged_attention_ref(
        q, k_cache.float(), v_cache.float(), meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.25
    )
    torch.testing.assert_close(out, expected, **FP32_TOL)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_chat_gguf(tmp_path_factory.mktemp("fp16kv") / "tiny.gguf", seed=3, num_layers=2)


def test_an_engine_on_an_fp16_pool_fits_twice_the_blocks_and_generates(tiny_gguf):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    chats = [[{"role": "user", "content": f"tell me about {w}"}] for w in ("paging", "caches", "blocks")]
    runs = {}
    for kv in ("auto", "float16"):  # exact fp32 activations: auto keeps the model's dtype
        llm = LLM(model=str(tiny_gguf), int8_activations=False, kv_cache_bytes=4 * 2**20, kv_cache_dtype=kv)
        engine = llm.engine
        token_ids = [o.outputs[0].token_ids for o in llm.chat(chats, params)]
        stats = engine.stats()
        runs[kv] = (engine.num_blocks, stats.kv_cache_dtype, token_ids)
        assert (
            stats.num_used_blocks == 0 and stats.num_free_blocks + stats.num_cached_blocks == stats.num_blocks
        )
    assert runs["auto"][1] == "float32" and runs["float16"][1] == "float16"
    assert runs["float16"][0] == 2 * runs["auto"][0]
    # fp16 keeps 11 bits of each K/V value: the random tiny model's greedy replies (near ties in its logits) agree
    # for most tokens; the real model's 16 prompts x 64 tokens agree whole (`pagedchat bench quality`)
    assert all(len(ids) == 8 for ids in runs["float16"][2])
    agree = [a[:4] == b[:4] for a, b in zip(runs["auto"][2], runs["float16"][2], strict=True)]
    assert all(agree) and sum(a == b for a, b in zip(runs["auto"][2], runs["float16"][2])) >= 2


def test_auto_is_fp16_only_where_the_activations_are_already_rounded_to_int8(tiny_gguf):
    """The default GGUF mode (int8 activations in the blocks' kernels) takes an fp16 pool; exact modes keep the
    activations' dtype (fp32 with GGUF blocks; without them, bf16 where the CPU has fast bf16, as dtype auto picks)."""
    dense = "bfloat16" if cpu_has_fast_bf16() else "float32"
    cases = {
        (): "float16",  # quantization auto -> gguf, int8 activations by default
        (("int8_activations", False),): "float32",
        (("quantization", "none"),): dense,
        (("int8_activations", True), ("kv_cache_dtype", "int8")): "int8",
        (
            ("kv_cache_dtype", "model"),
        ): "float32",  # int8 activations over the model's own dtype: one flag away
    }
    for overrides, expected in cases.items():
        llm = LLM(model=str(tiny_gguf), kv_cache_bytes=2**20, **dict(overrides))
        assert llm.engine.kv_cache_dtype == expected, overrides
        asked = dict(overrides).get("kv_cache_dtype", "auto")
        assert llm.engine.config.kv_cache_dtype == (asked if expected in ("float32", dense) else expected)


def test_bf16_activations_refuse_an_fp16_pool(tiny_gguf):
    with pytest.raises(ValueError, match="kv_cache_dtype float16 is for float32 activations"):
        LLM(
            model=str(tiny_gguf),
            quantization="none",
            dtype="bfloat16",
            kv_cache_dtype="float16",
            kv_cache_bytes=2**20,
        )


def test_the_triton_kernels_refuse_an_fp16_pool_under_fp32_activations(tiny_gguf):
    with pytest.raises(
        ValueError, match="kv_cache_dtype float16 under float32 activations is read by the CPU"
    ):
        LLM(model=str(tiny_gguf), kv_cache_dtype="float16", attention_backend="triton", kv_cache_bytes=2**20)

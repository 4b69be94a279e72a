"""The engine with an int8 KV pool (--kv-cache-dtype int8) on a tiny random model: capacity at a byte budget,
preemption, chunking, prefix caching and copy-on-write work unchanged, and every block returns to the pool."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.worker.kv_cache import KVCacheSpec
from tests.engine.bench_helpers import make_tiny_model_folder
from tests.engine.test_engine_lifecycle import assert_pool_idle, greedy, prompts

BUDGET = 3 * 2**20
# 4096 blocks of 16 tokens (2304 bytes each in int8): room for every prompt here. Without a budget an engine takes
# 90% of the machine's free memory, ~900,000 blocks on 24 GiB, ~7 s to allocate and index each time.
ROOMY = 4096 * 2304


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_folder(tmp_path_factory.mktemp("tiny")))


def run(model_dir: str, **overrides) -> tuple[list[list[int]], LLM]:
    llm = LLM(
        model=model_dir, dtype="float32", kv_cache_dtype="int8", **{"kv_cache_bytes": ROOMY, **overrides}
    )
    outs = llm.generate(prompts(8), greedy())
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.mark.parametrize(
    ("dtype", "head_dim", "ratio"),
    [(torch.bfloat16, 64, 128 / 66), (torch.float32, 64, 256 / 66), (torch.float32, 16, 64 / 18)],
)
def test_block_bytes_shrink_by_exactly_the_bytes_per_token_ratio(dtype, head_dim, ratio):
    spec = KVCacheSpec(num_layers=30, num_kv_heads=3, head_dim=head_dim, block_size=16, dtype=dtype)
    int8 = KVCacheSpec(30, 3, head_dim, 16, dtype, kv_cache_dtype="int8")
    assert spec.block_bytes / int8.block_bytes == pytest.approx(ratio, rel=1e-12)
    assert int8.block_bytes == 2 * 30 * 16 * 3 * (head_dim + 2)  # values + one fp16 scale per token and head
    values, scales = int8.allocate(5, torch.device("cpu"))
    assert values.dtype == torch.int8 and scales.dtype == torch.float16
    assert values.nbytes + scales.nbytes == 5 * int8.block_bytes
    assert int8.dtype_name == "int8" and spec.dtype_name == str(dtype).removeprefix("torch.")


def test_pool_capacity_at_one_budget_grows_by_the_ratio(model_dir):
    floats = LLM(model=model_dir, dtype="float32", kv_cache_bytes=BUDGET).engine
    int8 = LLM(model=model_dir, dtype="float32", kv_cache_bytes=BUDGET, kv_cache_dtype="int8").engine
    # tiny model: 2 layers x 2 KV heads x head_dim 16: 64 bytes a row in fp32, 16 + 2 in int8
    assert floats.kv_block_bytes == 2 * 2 * 16 * 2 * 64 and int8.kv_block_bytes == 2 * 2 * 16 * 2 * 18
    assert (
        floats.num_blocks == BUDGET // floats.kv_block_bytes
        and int8.num_blocks == BUDGET // int8.kv_block_bytes
    )
    assert int8.num_blocks / floats.num_blocks == pytest.approx(64 / 18, rel=1e-3)
    assert int8.stats().kv_cache_dtype == "int8" and floats.stats().kv_cache_dtype == "float32"
    assert int8.stats().capacity_tokens == int8.num_blocks * 16


def test_preemption_and_chunking_produce_the_unconstrained_int8_tokens(model_dir):
    reference, _ = run(model_dir)
    tight, llm = run(model_dir, kv_cache_bytes=16 * 2304, max_model_len=256)  # 16 blocks: preemption
    assert llm.engine.stats().num_preemptions > 0
    assert tight == reference
    assert_pool_idle(llm.engine)
    chunked, llm = run(model_dir, max_num_batched_tokens=19, max_num_seqs=3)
    assert chunked == reference
    assert_pool_idle(llm.engine)


def test_prefix_hits_over_int8_blocks_reproduce_the_uncached_reply(model_dir):
    cold, _ = run(model_dir, enable_prefix_caching=False)
    llm = LLM(model=model_dir, dtype="float32", kv_cache_dtype="int8", kv_cache_bytes=ROOMY)
    first = llm.generate(prompts(8), greedy())
    again = llm.generate(prompts(8), greedy())
    assert [o.outputs[0].token_ids for o in first] == cold == [o.outputs[0].token_ids for o in again]
    assert sum(o.num_cached_tokens for o in again) > 0
    assert_pool_idle(llm.engine)


def test_forked_sequences_share_blocks_and_copy_their_scales_on_write(model_dir):
    llm = LLM(model=model_dir, dtype="float32", kv_cache_dtype="int8", kv_cache_bytes=ROOMY)
    prompt = prompts(3)[2]  # ends mid-block: the shared tail block is copied when the children diverge
    assert len(prompt) % 16
    single = llm.generate([prompt], greedy())[0].outputs[0].token_ids
    pair = llm.generate([prompt], SamplingParams(n=2, temperature=0.0, max_tokens=24, ignore_eos=True))[0]
    assert [c.token_ids for c in pair.outputs] == [single, single]
    assert_pool_idle(llm.engine)


def test_copy_blocks_carries_the_scales(model_dir):
    runner = LLM(model=model_dir, dtype="float32", kv_cache_dtype="int8", kv_cache_bytes=BUDGET).engine.runner
    runner.kv_cache.random_(-127, 128)
    runner.kv_scales.uniform_(0.01, 1.0)
    runner.copy_blocks([(3, 9), (4, 10)])
    for pool in (runner.kv_cache, runner.kv_scales):
        assert torch.equal(pool[:, :, [9, 10]], pool[:, :, [3, 4]])

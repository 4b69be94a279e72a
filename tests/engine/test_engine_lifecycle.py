"""The engine end to end on a tiny random model: preemption, chunking, n>1, aborts, bad input, faults."""

from __future__ import annotations

import pytest

from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.core.sequence import FinishReason
from tests.engine.bench_helpers import make_tiny_model_folder

BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 4  # layers x (K, V) x kv_heads x head_dim x block tokens x fp32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_folder(tmp_path_factory.mktemp("tiny")))


def prompts(n: int) -> list[list[int]]:
    # ragged lengths, some longer than a block, some ending mid-block
    return [[(7 * i + j) % 300 + 3 for j in range(5 + 23 * i % 90)] for i in range(n)]


def greedy(max_tokens: int = 24) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def run(model_dir: str, **overrides) -> tuple[list[list[int]], LLM]:
    llm = LLM(model=model_dir, dtype="float32", **overrides)
    outs = llm.generate(prompts(8), greedy())
    return [o.outputs[0].token_ids for o in outs], llm


def assert_pool_idle(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.num_used_blocks == 0, f"{stats.num_used_blocks} blocks still in use"
    assert stats.num_free_blocks + stats.num_cached_blocks == stats.num_blocks
    assert not engine.has_unfinished_requests()


def test_preemption_and_chunking_produce_the_unconstrained_tokens(model_dir):
    reference, _ = run(model_dir, kv_cache_bytes=4096 * BLOCK_BYTES)
    # a pool of 16 blocks holds at most two of these sequences: preemption by recompute must happen
    tight, llm = run(model_dir, kv_cache_bytes=16 * BLOCK_BYTES, max_model_len=256)
    assert llm.engine.stats().num_preemptions > 0
    assert tight == reference
    assert_pool_idle(llm.engine)
    # chunked prefill with chunks that are not block multiples
    chunked, llm = run(
        model_dir, kv_cache_bytes=4096 * BLOCK_BYTES, max_num_batched_tokens=19, max_num_seqs=3
    )
    assert chunked == reference
    assert_pool_idle(llm.engine)
    no_cache, llm = run(
        model_dir, kv_cache_bytes=16 * BLOCK_BYTES, max_model_len=256, enable_prefix_caching=False
    )
    assert no_cache == reference


def test_parallel_samples_are_seeded_and_share_the_prompt(model_dir):
    llm = LLM(model=model_dir, dtype="float32", kv_cache_bytes=256 * BLOCK_BYTES)
    params = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=7, ignore_eos=True)
    first = llm.generate([prompts(3)[2]], params)[0]
    again = llm.generate([prompts(3)[2]], params)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1
    # child i is seeded with seed + i: a single sample with seed 8 reproduces child 1
    single = llm.generate(
        [prompts(3)[2]], SamplingParams(temperature=1.0, max_tokens=12, seed=8, ignore_eos=True)
    )
    assert single[0].outputs[0].token_ids == first.outputs[1].token_ids
    assert_pool_idle(llm.engine)
    # a finished sequence's generator goes with the next step, when the scheduler reports it finished
    assert len(llm.engine.runner.seeded_generators) == 1 and llm.engine.step() == []
    assert llm.engine.runner.seeded_generators == {}


def test_abort_frees_blocks_at_once(model_dir):
    engine = LLMEngine(EngineConfig(model=model_dir, dtype="float32", kv_cache_bytes=256 * BLOCK_BYTES))
    engine.add_request("a", prompts(4)[3], greedy(50))
    engine.add_request("b", prompts(4)[1], greedy(50))
    engine.step()
    engine.step()
    assert engine.stats().num_used_blocks > 0
    engine.abort_request("a")
    outputs = {o.request_id: o for o in engine.step()}
    assert outputs["a"].finished and outputs["a"].outputs[0].finish_reason is FinishReason.ABORT
    assert not outputs["b"].finished
    engine.abort_request("b")
    engine.step()
    assert_pool_idle(engine)


def test_bad_input_is_a_value_error_naming_the_limit(model_dir):
    engine = LLMEngine(
        EngineConfig(model=model_dir, dtype="float32", kv_cache_bytes=64 * BLOCK_BYTES, max_model_len=128)
    )
    with pytest.raises(
        ValueError, match=r"prompt \(100 tokens\) \+ max_tokens \(50\) exceeds max_model_len \(128\)"
    ):
        engine.add_request("x", [5] * 100, SamplingParams(max_tokens=50))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("x", [], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("x", [10**9], SamplingParams())
    engine.add_request("x", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("x", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=float("nan"))


def test_pool_smaller_than_one_sequence_is_refused_with_both_numbers(model_dir):
    with pytest.raises(ValueError, match=r"holds 64 tokens .* max_model_len sequence \(512\)"):
        LLMEngine(
            EngineConfig(model=model_dir, dtype="float32", kv_cache_bytes=4 * BLOCK_BYTES, max_model_len=512)
        )


def test_a_fault_in_one_requests_detokenization_fails_only_that_request(model_dir, monkeypatch):
    engine = LLMEngine(EngineConfig(model=model_dir, dtype="float32", kv_cache_bytes=256 * BLOCK_BYTES))
    engine.add_request("bad", prompts(3)[1], greedy(8))
    engine.add_request("good", prompts(3)[2], greedy(8))
    (bad_sample,) = engine.output_processor.request_states["bad"].samples
    bad_detok = bad_sample.detokenizer

    def explode(ids):
        raise UnicodeError("injected")

    monkeypatch.setattr(bad_detok, "step", explode)
    results = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out
    assert results["bad"].error is not None and "injected" in results["bad"].error
    assert results["bad"].outputs[0].finish_reason is FinishReason.ERROR
    assert results["good"].error is None and len(results["good"].outputs[0].token_ids) == 8
    assert_pool_idle(engine)


def test_a_fault_in_the_batched_step_fails_that_steps_requests_and_the_engine_goes_on(model_dir, monkeypatch):
    engine = LLMEngine(EngineConfig(model=model_dir, dtype="float32", kv_cache_bytes=256 * BLOCK_BYTES))
    engine.add_request("a", prompts(2)[1], greedy(4))
    original = engine.runner.execute
    calls = {"n": 0}

    def flaky(out):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected step fault")
        return original(out)

    monkeypatch.setattr(engine.runner, "execute", flaky)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].finished and "injected step fault" in outs[-1].error
    assert_pool_idle(engine)
    engine.add_request("b", prompts(2)[1], greedy(4))
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert outs[-1].error is None and len(outs[-1].outputs[0].token_ids) == 4

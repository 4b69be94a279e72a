"""EngineConfig.step_timing: a served engine's decode-only steps timed per batch size, split into the linears,
attention and the rest, on the fused C step and on the per-module path alike; nothing is timed when it is off."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from tests.engine.gguf_factories import write_tiny_chat_gguf

KV_BYTES = 8 * 2**20


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_chat_gguf(tmp_path_factory.mktemp("timing") / "tiny.gguf", seed=5, num_layers=2)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "modules"])
def test_decode_steps_are_timed_per_batch_size(tiny_gguf, fused):
    llm = LLM(
        model=str(tiny_gguf),
        quantization="gguf",
        fused_decode=fused,
        step_timing=True,
        kv_cache_bytes=KV_BYTES,
        # steps counted by batch size below: a proposal verified would end a request a step early (the planner
        # proposes or not by the step times it measures, which follow the machine's load)
        speculative_method="off",
    )
    engine = llm.engine
    assert (engine.runner.fused is not None) == fused
    # 3 requests of different lengths: decode steps at batch 3, then 2, then 1
    for i, max_tokens in enumerate((4, 7, 10)):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(
            f"r{i}", engine.apply_chat_template([{"role": "user", "content": f"hi {i}"}]), params
        )
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    timings = {t.batch_size: t for t in engine.stats().step_timings}
    assert engine.snapshot().stats.step_timings == engine.stats().step_timings  # what /api/admin/state shows
    assert set(timings) == {1, 2, 3}
    # every request's first token comes from its prefill step (not timed); the others from decode-only steps
    assert {b: t.num_steps for b, t in timings.items()} == {3: 3, 2: 3, 1: 3}
    assert sum(t.num_steps for t in timings.values()) < steps
    for t in timings.values():
        assert t.matmul_s > 0 and t.attention_s > 0
        assert t.step_s > t.matmul_s + t.attention_s  # the rest: scheduling, inputs, sampling, detokenization


def test_nothing_is_timed_when_step_timing_is_off(tiny_gguf):
    llm = LLM(model=str(tiny_gguf), quantization="gguf", kv_cache_bytes=KV_BYTES)
    llm.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert llm.engine.stats().step_timings == ()
    assert (
        llm.engine.runner.fused is not None and llm.engine.runner.fused.seconds[0] > 0
    )  # C always keeps its clock

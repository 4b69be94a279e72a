"""The engine with the Triton backend (interpreted, fp32, CPU) generates the same greedy tokens as the torch one.

Covers what the kernel tests cannot: the engine's metadata conventions end to end, through chunked prefill
(16-token step budget), a prefix-cache hit and mixed prefill/decode steps.
"""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.engine.bench_helpers import shared_tiny_model

pytestmark = pytest.mark.interpreted


def generate(backend: str) -> list[list[int]]:
    config = EngineConfig(
        model=shared_tiny_model(), device="cpu", dtype="float32", attention_backend=backend,
        kv_cache_bytes=2**20, max_model_len=128, max_num_batched_tokens=16,
    )  # fmt: skip
    engine = LLMEngine(config)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    prefix = [(7 * i) % 300 + 5 for i in range(21)]  # one full block, then 5 more tokens
    outputs: dict[str, list[int]] = {}
    for wave in ([("a", prefix + [11, 12])], [("b", prefix + [13]), ("c", [40, 41, 42])]):
        for request_id, prompt in wave:  # wave 2 runs after "a" finished: its prefix blocks are cached
            engine.add_request(request_id, prompt, params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out.outputs[0].token_ids
    assert engine.stats().prefix_hit_tokens >= 16
    return [outputs[request_id] for request_id in "abc"]


def test_triton_backend_generates_the_torch_backends_greedy_tokens() -> None:
    triton_tokens = generate("triton")
    assert [len(tokens) for tokens in triton_tokens] == [5, 5, 5]
    assert triton_tokens == generate("torch")

"""Greedy SmolLM2 output equals HF transformers' generate, token for token, in fp32 (quantization none)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.loading.loader import resolve_model_path

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Give me a short Python function that reverses a string.",
    "Tell me a fun fact about octopuses. Then summarise it in one word.",
]
MAX_TOKENS = 24
NEAR_TIE = 1e-4


@pytest.fixture(scope="module")
def model_path():
    return resolve_model_path("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def hf_reference(model_path):
    """HF greedy continuations, one request at a time, the model for near-tie checks, and our fresh prefix-caching
    engine (it only templates the prompts here, so it reaches the test with an empty cache: one engine load less)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    llm = _our_llm(model_path, caching=True)
    prompts = [llm.engine.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    eos = sorted(llm.engine.eos_token_ids)
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            tokens = out[0, len(ids) :].tolist()
            outputs.append(tokens)
    return model, prompts, outputs, llm


def _our_llm(model_path, caching: bool) -> LLM:
    return LLM(
        model=str(model_path),
        dtype="float32",
        quantization="none",  # explicit: the fp32 weights HF runs, whatever auto would pick
        kv_cache_bytes=256 * 2**20,
        enable_prefix_caching=caching,
    )


def _assert_same_greedy(model, prompt: list[int], ours: list[int], ref: list[int]) -> None:
    """Equal token for token, or diverging only where HF's two top logits are within NEAR_TIE."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            with torch.inference_mode():
                logits = model(torch.tensor([prompt + ref[:i]])).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            gap = float(top2[0] - top2[1])
            assert gap < NEAR_TIE, (
                f"diverged at output token {i}: ours {a}, HF {b}, top-2 logit gap {gap:.2e}"
            )
            return
    assert len(ours) == len(ref), f"ours stopped after {len(ours)} tokens, HF after {len(ref)}"


# Two diagonal configurations cover both axes (each value of each once): one at a time with the prefix cache (later
# prompts share the chat template's prefix, so cached blocks are read back), and one batch without it (every
# prompt's tokens computed, side by side in one step). The other two corners added no path of their own and
# cost 13 s of the suite.
@pytest.mark.budget(
    seconds=60, why="SmolLM2 in fp32: HF generate's reference for 8 prompts (module setup) and a run"
)
@pytest.mark.parametrize(
    ("batched", "caching"),
    [(False, True), (True, False)],
    ids=["one-at-a-time-prefix-caching", "one-batch-no-caching"],
)
def test_greedy_equals_hf(hf_reference, model_path, batched, caching):
    model, prompts, ref, caching_llm = hf_reference
    llm = caching_llm if caching else _our_llm(model_path, caching=False)
    assert llm.engine.config.enable_prefix_caching is caching
    assert llm.engine.scheduler.block_manager.stats().prefix_query_tokens == 0  # nothing generated before
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = llm.generate(prompts, params) if batched else [llm.generate([p], params)[0] for p in prompts]
    for prompt, out, expected in zip(prompts, outs, ref):
        _assert_same_greedy(model, prompt, out.outputs[0].token_ids, expected)
        if not caching:
            assert out.num_cached_tokens == 0

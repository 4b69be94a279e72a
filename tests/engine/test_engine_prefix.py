"""Prefix caching through the whole engine with the real SmolLM2: system prompts, block alignment, next turns."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.loading.loader import resolve_model_path

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(model=str(resolve_model_path("smollm2-135m-instruct")), kv_cache_bytes=256 * 2**20)


@pytest.fixture(scope="module")
def llm_no_cache() -> LLM:
    return LLM(
        model=str(resolve_model_path("smollm2-135m-instruct")),
        kv_cache_bytes=256 * 2**20,
        enable_prefix_caching=False,
    )


def system_prompt(llm: LLM, num_tokens: int) -> list[int]:
    words = " ".join(f"rule{i}" for i in range(num_tokens * 2))
    return llm.tokenizer.encode(words, add_special_tokens=False)[:num_tokens]


def test_second_request_with_same_300_token_prefix_hits_288(llm):
    prefix = system_prompt(llm, 300)
    first = llm.generate([prefix + llm.tokenizer.encode(" first question")], GREEDY)[0]
    second = llm.generate([prefix + llm.tokenizer.encode(" another question entirely")], GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens >= 288
    assert llm.engine.stats().num_used_blocks == 0


def test_fully_cached_block_aligned_prompt_still_computes_its_last_token(llm):
    prompt = system_prompt(llm, 300)[:64]  # exactly 4 blocks of 16
    first = llm.generate([prompt], GREEDY)[0]
    again = llm.generate([prompt], GREEDY)[0]
    # 3 blocks come from the cache, the 4th is copied and its last token recomputed, so that it yields logits
    assert again.num_cached_tokens == 63
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_a_prompt_forking_inside_a_cached_block_copies_it_and_generates_the_same(llm, llm_no_cache):
    prefix = system_prompt(llm, 300)
    llm.generate([prefix[:200] + llm.tokenizer.encode(" one branch of the chat")], GREEDY)
    fork = prefix[:197] + llm.tokenizer.encode(" another branch entirely")  # parts inside block 12 (192..207)
    copied = llm.generate([fork], GREEDY)[0]
    assert copied.num_cached_tokens == 197  # 12 blocks hit, and 5 tokens of the 13th copied
    no_copy = LLM(
        model=str(resolve_model_path("smollm2-135m-instruct")),
        kv_cache_bytes=256 * 2**20,
        kv_disk_bytes=0,  # no blocks from the other engines' disk tier
        copy_partial_blocks=False,
    )
    no_copy.generate([prefix[:200] + llm.tokenizer.encode(" one branch of the chat")], GREEDY)
    recomputed = no_copy.generate([fork], GREEDY)[0]
    assert recomputed.num_cached_tokens == 192
    plain = llm_no_cache.generate([fork], GREEDY)[0]
    assert copied.outputs[0].token_ids == recomputed.outputs[0].token_ids == plain.outputs[0].token_ids


def test_next_turn_reuses_prompt_and_answer(llm):
    messages = [
        {"role": "system", "content": "You are a concise assistant who answers in one sentence."},
        {"role": "user", "content": "Name a large animal that lives in the ocean."},
    ]
    prompt = llm.engine.apply_chat_template(messages)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40))[0]
    answer_ids = out.outputs[0].token_ids
    # the next prompt extends the previous prompt + answer exactly (as the session service builds it)
    follow_up = llm.tokenizer.encode(
        "\n<|im_start|>user\nAnd a small one?<|im_end|>\n<|im_start|>assistant\n"
    )
    next_prompt = prompt + answer_ids + follow_up
    nxt = llm.generate([next_prompt], GREEDY)[0]
    expected = (len(prompt) + len(answer_ids) - 1) // 16 * 16
    assert nxt.num_cached_tokens >= expected


def test_caching_off_reports_zero_everywhere(llm_no_cache):
    # 4 full blocks: a cache would serve 64 of the second prompt's tokens (a 300-token prefix read twice on the
    # real model was ~3 s alone, 12 s under the suite's load, for the same zero)
    prefix = system_prompt(llm_no_cache, 64)
    outs = [llm_no_cache.generate([prefix + [i + 100]], GREEDY)[0] for i in range(2)]
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    stats = llm_no_cache.engine.stats()
    assert stats.prefix_hit_tokens == 0
    assert stats.num_cached_blocks == 0

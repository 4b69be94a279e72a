"""Prompt logprobs (SamplingParams.prompt_logprobs, vLLM's meaning) equal a teacher-forced HF forward over the prompt:
read in one step or in chunks, after a prefix-cache hit, batched with other requests, preempted; the blocks all come
back."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.core.outputs import Logprob, RequestOutput
from tests.engine.bench_helpers import make_tiny_model_folder

TOP = 3
ATOL = 1e-4  # fp32 on both sides; only the summation order differs
CHUNK = 48  # max_num_batched_tokens: a 40-token prompt is read in one step, a 70-token one in two or more
BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 4  # layers x (K, V) x kv_heads x head_dim x block tokens x fp32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_folder(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    return LLM(
        model=model_dir,
        dtype="float32",
        kv_cache_bytes=1024 * BLOCK_BYTES,
        max_model_len=512,
        max_num_batched_tokens=CHUNK,
        max_num_seqs=4,
    )


def prompt(seed: int, num_tokens: int) -> list[int]:
    return [(7 * seed + 13 * j + j * j) % 300 + 3 for j in range(num_tokens)]


def reference(hf_model, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, vocab] log-probabilities of each next token, teacher-forced in one forward."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def assert_matches(
    ids: list[int], got: list[Logprob | None] | None, ref: torch.Tensor, top: int = TOP
) -> None:
    assert got is not None and len(got) == len(ids)
    assert got[0] is None
    for pos, lp in enumerate(got[1:], start=1):
        row = ref[pos - 1]
        target = row[ids[pos]]
        assert lp is not None and lp.token_id == ids[pos]
        assert lp.logprob == pytest.approx(target.item(), abs=ATOL), f"prompt token {pos}"
        assert int((row > target + ATOL).sum()) + 1 <= lp.rank <= int((row > target - ATOL).sum()) + 1
        assert [v for _, v in lp.top] == pytest.approx(row.topk(top).values.tolist(), abs=ATOL)


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
    outputs = llm.generate(prompts, params)
    assert llm.engine.stats().num_used_blocks == 0, "a request kept KV blocks after it finished"
    return outputs


WANT = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=TOP)
PLAIN = SamplingParams(temperature=0.0, max_tokens=2)


def test_prompt_logprobs_equal_a_teacher_forced_forward(llm, hf_model):
    ids = prompt(1, 40)  # one step reads it all
    [out] = run(llm, [ids], [WANT])
    assert_matches(ids, out.prompt_logprobs, reference(hf_model, ids))
    [plain] = run(llm, [ids], [PLAIN])
    assert plain.prompt_logprobs is None
    assert plain.outputs[0].token_ids == out.outputs[0].token_ids


def test_a_cached_prefix_is_computed_again_not_left_out(llm, hf_model):
    ids = prompt(2, 70)
    run(llm, [ids], [PLAIN])  # its full blocks are now cached
    [warm] = run(llm, [ids], [PLAIN])
    assert warm.num_cached_tokens == 64
    [out] = run(llm, [ids], [WANT])
    assert out.num_cached_tokens == 0  # the hit is skipped: a cached block has no logits
    assert_matches(ids, out.prompt_logprobs, reference(hf_model, ids))
    [after] = run(llm, [ids], [PLAIN])  # the blocks it computed are shared again afterwards
    assert after.num_cached_tokens == 64


def test_chunked_prefill_batched_with_other_requests(llm, hf_model):
    steps_before = llm.engine.stats().num_steps
    prompts = [prompt(3, 70), prompt(4, 50), prompt(5, 61), prompt(6, 1)]
    params = [WANT, PLAIN, SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=0), WANT]
    outs = run(llm, prompts, params)
    assert_matches(prompts[0], outs[0].prompt_logprobs, reference(hf_model, prompts[0]))
    assert outs[1].prompt_logprobs is None
    assert_matches(prompts[2], outs[2].prompt_logprobs, reference(hf_model, prompts[2]), top=0)
    assert outs[3].prompt_logprobs == [None]  # one token: nothing before it to score
    # 182 prompt tokens in steps of at most CHUNK: the long prompts were read in chunks, beside each other
    assert llm.engine.stats().num_steps - steps_before >= 182 // CHUNK + 1


def test_n_samples_share_one_prompt_scoring(llm, hf_model):
    ids = prompt(7, 40)
    params = SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=2, prompt_logprobs=1)
    [out] = run(llm, [ids], [params])
    assert len(out.outputs) == 3
    assert_matches(ids, out.prompt_logprobs, reference(hf_model, ids), top=1)


def test_preempted_requests_score_their_prompts_as_undisturbed_ones(model_dir, hf_model):
    prompts = [prompt(i, 5 + 23 * i % 90) for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logprobs=2)
    # 16 blocks hold about two of these sequences, read in chunks of 19: preempted mid-prompt and after it
    tight = LLM(
        model=model_dir,
        dtype="float32",
        kv_cache_bytes=16 * BLOCK_BYTES,
        max_model_len=256,
        max_num_batched_tokens=19,
    )
    outs = run(tight, prompts, [params] * len(prompts))
    assert tight.engine.stats().num_preemptions > 0
    for ids, out in zip(prompts, outs, strict=True):
        assert_matches(ids, out.prompt_logprobs, reference(hf_model, ids), top=2)


def test_prompt_logprobs_out_of_range_is_a_value_error():
    with pytest.raises(ValueError, match=r"prompt_logprobs must be an integer in \[0, 20\], got 21"):
        SamplingParams(prompt_logprobs=21)

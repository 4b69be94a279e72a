"""Prompt logprobs (SamplingParams.prompt_logprobs, vLLM's meaning) equal a teacher-forced HF forward over the prompt:
read in one step or in chunks, after a prefix-cache hit, batched with other requests; the blocks all come back."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.core.outputs import Logprob, RequestOutput
from engine.loading.loader import resolve_model_path

pytestmark = pytest.mark.slow

TOP = 3
ATOL = 2e-3  # fp32 both sides; only the summation order differs
CHUNK = 48  # max_num_batched_tokens: a 40-token prompt is read in one step, a 70-token one in two or more


@pytest.fixture(scope="module")
def model_path():
    return resolve_model_path("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def hf_model(model_path):
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


def make_llm(model_path, **overrides) -> LLM:
    return LLM(
        model=str(model_path),
        dtype="float32",
        quantization="none",
        kv_cache_bytes=64 * 2**20,
        max_model_len=512,
        **overrides,
    )


@pytest.fixture(scope="module")
def llm(model_path) -> LLM:
    return make_llm(model_path, max_num_batched_tokens=CHUNK, max_num_seqs=4)


def prompt(llm: LLM, topic: str, num_tokens: int = 70) -> list[int]:
    words = " ".join(f"{topic} fact {i} is that paged attention stores keys in blocks." for i in range(20))
    return llm.tokenizer.encode(words, add_special_tokens=False)[:num_tokens]


def reference(hf_model, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, vocab] log-probabilities of each next token, teacher-forced in one forward."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def assert_matches(ids: list[int], got: list[Logprob | None] | None, ref: torch.Tensor) -> None:
    assert got is not None and len(got) == len(ids)
    assert got[0] is None
    for pos, lp in enumerate(got[1:], start=1):
        row = ref[pos - 1]
        assert lp is not None and lp.token_id == ids[pos]
        assert lp.logprob == pytest.approx(row[ids[pos]].item(), abs=ATOL), f"prompt token {pos}"
        target = row[ids[pos]]
        assert int((row > target + ATOL).sum()) + 1 <= lp.rank <= int((row > target - ATOL).sum()) + 1
        top_vals, top_ids = row.topk(TOP)
        assert [v for _, v in lp.top] == pytest.approx(top_vals.tolist(), abs=ATOL)
        assert [t for t, _ in lp.top][0] == top_ids[0].item() or top_vals[0] - top_vals[1] < ATOL


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
    outputs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats.num_used_blocks == 0, "a request kept KV blocks after it finished"
    return outputs


WANT = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=TOP)
PLAIN = SamplingParams(temperature=0.0, max_tokens=2)


def test_prompt_logprobs_equal_a_teacher_forced_forward(llm, hf_model):
    ids = prompt(llm, "alpha", 40)  # one step reads it all
    [out] = run(llm, [ids], [WANT])
    assert_matches(ids, out.prompt_logprobs, reference(hf_model, ids))
    [plain] = run(llm, [ids], [PLAIN])
    assert plain.prompt_logprobs is None
    assert plain.outputs[0].token_ids == out.outputs[0].token_ids


def test_a_cached_prefix_is_computed_again_not_left_out(llm, hf_model):
    ids = prompt(llm, "beta")
    run(llm, [ids], [PLAIN])  # its full blocks are now cached
    [warm] = run(llm, [ids], [PLAIN])
    assert warm.num_cached_tokens >= 64
    [out] = run(llm, [ids], [WANT])
    assert out.num_cached_tokens == 0  # the hit is skipped: a cached block has no logits
    assert_matches(ids, out.prompt_logprobs, reference(hf_model, ids))
    [after] = run(llm, [ids], [PLAIN])  # the blocks it computed are shared again afterwards
    assert after.num_cached_tokens >= 64


def test_chunked_prefill_batched_with_other_requests(llm, hf_model):
    steps_before = llm.engine.stats().num_steps
    prompts = [prompt(llm, t, n) for t, n in (("gamma", 70), ("delta", 50), ("eps", 61), ("zeta", 1))]
    params = [WANT, PLAIN, SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=0), WANT]
    outs = run(llm, prompts, params)
    assert_matches(prompts[0], outs[0].prompt_logprobs, reference(hf_model, prompts[0]))
    assert outs[1].prompt_logprobs is None
    got = outs[2].prompt_logprobs
    ref = reference(hf_model, prompts[2])
    assert got is not None and got[0] is None and all(lp is not None and lp.top == [] for lp in got[1:])
    assert [lp.logprob for lp in got[1:]] == pytest.approx(
        ref.gather(1, torch.tensor(prompts[2][1:]).unsqueeze(1)).squeeze(1).tolist(), abs=ATOL
    )
    assert outs[3].prompt_logprobs == [None]  # one token: nothing before it to score
    # 182 prompt tokens in steps of at most CHUNK: the long prompts were read in chunks, beside each other
    assert llm.engine.stats().num_steps - steps_before >= 182 // CHUNK + 1


def test_n_samples_share_one_prompt_scoring(llm, hf_model):
    ids = prompt(llm, "eta", 40)
    params = SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=2, prompt_logprobs=1)
    [out] = run(llm, [ids], [params])
    assert len(out.outputs) == 3
    assert_matches_top1(ids, out.prompt_logprobs, reference(hf_model, ids))


def assert_matches_top1(ids: list[int], got: list[Logprob | None] | None, ref: torch.Tensor) -> None:
    assert got is not None and got[0] is None
    values = [lp.logprob for lp in got[1:] if lp is not None]
    expected = ref.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()
    assert values == pytest.approx(expected, abs=ATOL)
    assert all(lp is not None and len(lp.top) == 1 for lp in got[1:])


def test_prompt_logprobs_out_of_range_is_a_value_error():
    with pytest.raises(ValueError, match=r"prompt_logprobs must be an integer in \[0, 20\], got 21"):
        SamplingParams(prompt_logprobs=21)

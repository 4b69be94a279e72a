"""An evaluation harness's loglikelihood protocol against a real server: lm-evaluation-harness's `local-completions`
model scores each (context, continuation) with one /v1/completions request (`echo`, `logprobs: 1`, `max_tokens: 1`,
`temperature: 0`) and reads `choices[].logprobs.token_logprobs[ctxlen:-1]`, `top_logprobs` for is-greedy.

`EvalClient` speaks that protocol as lm_eval 0.4.13's `LocalCompletionsAPI` does (request body, the pair encoding, the
parsing), written here: lm-eval itself pulls ~37 packages (datasets, pandas, pyarrow, scipy, scikit-learn, ...) that
pagedchat does not need. Run by hand once (lm_eval 0.4.13, `--model local-completions`, the task below as a YAML
task over this JSONL file), lm-eval's loglikelihoods equalled this client's to the bit and its acc was the same.
A five-item multiple-choice task from a local JSONL file; its accuracy and every loglikelihood equal a
teacher-forced HF forward and the engine's own prompt logprobs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ATOL = 1e-3  # fp32 on both sides, per continuation (a sum over its tokens)
TASK = [
    {"question": "What colour is the sky on a clear day?", "choices": ["blue", "green", "red"], "gold": 0},
    {"question": "How many legs does a spider have?", "choices": ["six", "eight", "ten", "four"], "gold": 1},
    {
        "question": "Which planet is called the red planet?",
        "choices": ["Venus", "Mars", "Jupiter"],
        "gold": 1,
    },
    {"question": "What do bees make?", "choices": ["milk", "silk", "honey"], "gold": 2},
    {"question": "What is frozen water called?", "choices": ["ice", "steam", "sand"], "gold": 0},
]


@dataclass
class EvalClient:
    """Loglikelihoods the way lm-eval's local-completions model asks for them (batch size 1)."""

    base_url: str  # .../v1/completions
    model: str
    tokenizer: object

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The context's and the continuation's tokens: trailing spaces of the context move to the continuation,
        and the continuation is what the whole text adds to the context's tokens."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation, add_special_tokens=False)
        context_ids = self.tokenizer.encode(context, add_special_tokens=False)
        return context_ids, whole[len(context_ids) :]

    def payload(self, prompts: list[list[int]]) -> dict:
        return {
            "model": self.model,
            "prompt": prompts,
            "temperature": 0,
            "max_tokens": 1,
            "logprobs": 1,
            "seed": 1234,
            "echo": True,
        }

    def loglikelihood(self, context: str, continuation: str) -> tuple[float, bool, list[int], int]:
        """(sum of the continuation's logprobs, whether each was the top token), the ids sent, the context length."""
        context_ids, continuation_ids = self.encode_pair(context, continuation)
        ids = context_ids + continuation_ids
        response = httpx.post(
            self.base_url,
            json=self.payload([ids]),
            headers={"Authorization": "Bearer unused"},  # OPENAI_API_KEY: this server has no keys
            timeout=60,
        )
        response.raise_for_status()
        ctxlen = len(context_ids)
        [choice] = sorted(response.json()["choices"], key=itemgetter("index"))
        token_logprobs = choice["logprobs"]["token_logprobs"][
            ctxlen:-1
        ]  # the last is the one generated token
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(lp == max(top.values()) for lp, top in zip(token_logprobs, top_logprobs, strict=True))
        return sum(token_logprobs), greedy, ids, ctxlen


def write_task(path: Path) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in TASK))
    return path


def run_task(
    client: EvalClient, task_file: Path
) -> tuple[float, list[list[tuple[float, bool, list[int], int]]]]:
    """Accuracy of a multiple-choice task by loglikelihood, and every scored choice."""
    scored, correct = [], 0
    for line in task_file.read_text().splitlines():
        item = json.loads(line)
        context = f"Question: {item['question']}\nAnswer:"
        results = [client.loglikelihood(context, " " + choice) for choice in item["choices"]]
        scored.append(results)
        correct += max(range(len(results)), key=lambda i: results[i][0]) == item["gold"]
    return correct / len(scored), scored


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def reference(hf_model, ids: list[int], ctxlen: int) -> tuple[float, bool]:
    """Teacher-forced loglikelihood of ids[ctxlen:] given what precedes, and whether each token is the argmax."""
    with torch.inference_mode():
        logprobs = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    rows = logprobs[ctxlen - 1 : len(ids) - 1]
    targets = torch.tensor(ids[ctxlen:])
    chosen = rows.gather(1, targets.unsqueeze(1)).squeeze(1)
    return chosen.sum().item(), bool((rows.argmax(dim=-1) == targets).all())


def test_multiple_choice_task_scored_through_echo_and_logprobs(server, tiny_model, hf_model, tmp_path):
    model_id = httpx.get(server.base_url + "/v1/models").json()["data"][0]["id"]
    client = EvalClient(
        server.base_url + "/v1/completions", model_id, AutoTokenizer.from_pretrained(tiny_model)
    )
    acc, scored = run_task(client, write_task(tmp_path / "task.jsonl"))
    ref_correct = 0
    for item, results in zip(TASK, scored, strict=True):
        refs = [reference(hf_model, ids, ctxlen) for _, _, ids, ctxlen in results]
        for (ll, greedy, _, _), (ref_ll, ref_greedy) in zip(results, refs, strict=True):
            assert ll == pytest.approx(ref_ll, abs=ATOL)
            assert greedy == ref_greedy
        ref_correct += max(range(len(refs)), key=lambda i: refs[i][0]) == item["gold"]
    assert acc == ref_correct / len(TASK)
    # the choices share their question's blocks: each request read its prompt again rather than lose its logprobs
    server.wait_pool_idle()


def test_loglikelihood_is_the_sum_of_the_engines_prompt_logprobs(server, tiny_model):
    model_id = httpx.get(server.base_url + "/v1/models").json()["data"][0]["id"]
    client = EvalClient(
        server.base_url + "/v1/completions", model_id, AutoTokenizer.from_pretrained(tiny_model)
    )
    ll, _, ids, ctxlen = client.loglikelihood("Question: What do cows drink?\nAnswer:", " water, mostly")
    body = {"model": model_id, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    scores = httpx.post(client.base_url, json=body, timeout=60).json()["choices"][0]["prompt_logprobs"]
    assert scores[0] is None
    engine_sum = sum(scores[pos][str(ids[pos])]["logprob"] for pos in range(ctxlen, len(ids)))
    assert ll == pytest.approx(engine_sum, abs=1e-6)
    server.wait_pool_idle()

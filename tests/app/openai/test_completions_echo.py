"""/v1/completions scoring a prompt: `echo` with `logprobs` (the legacy block over prompt and output), `max_tokens: 0`
with echo, vLLM's `prompt_logprobs`, streaming, and a prefix-cache hit; values equal a teacher-forced HF forward."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.app.factories import make_client, make_tiny_model_dir, sse_events

MODEL_DIR = make_tiny_model_dir()
MODEL = MODEL_DIR.name
PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs into the forest to hide."
ATOL = 1e-4  # fp32 on both sides


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("echo")) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def reference():
    """ids -> [len(ids) - 1, vocab] next-token log-probabilities, teacher-forced in one HF forward."""
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)[:-1]

    return logprobs


def complete(client, **body) -> dict:
    response = client.post("/v1/completions", json={"model": MODEL, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def expected_prompt_logprobs(reference, ids: list[int]) -> list[float]:
    ref = reference(ids)
    return ref.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()


def test_echo_with_logprobs_covers_prompt_then_output(client, tokenizer, reference):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    plain = complete(client, prompt=PROMPT, max_tokens=3, logprobs=2)["choices"][0]
    body = complete(client, prompt=PROMPT, max_tokens=3, logprobs=2, echo=True)
    choice = body["choices"][0]
    assert choice["text"] == PROMPT + plain["text"]
    block = choice["logprobs"]
    assert len(block["tokens"]) == len(ids) + 3
    assert block["tokens"][: len(ids)] == [tokenizer.decode([t]) for t in ids]
    assert block["token_logprobs"][0] is None and block["top_logprobs"][0] is None
    assert block["token_logprobs"][1 : len(ids)] == pytest.approx(
        expected_prompt_logprobs(reference, ids), abs=ATOL
    )
    assert all(len(top) <= 2 for top in block["top_logprobs"][1:])
    # the output's part is what the same request without echo returns
    assert block["tokens"][len(ids) :] == plain["logprobs"]["tokens"]
    assert block["token_logprobs"][len(ids) :] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=ATOL)
    offsets = block["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[len(ids)] == len(PROMPT)
    assert body["usage"]["prompt_tokens"] == len(ids) and body["usage"]["completion_tokens"] == 3


def test_echo_with_max_tokens_0_returns_the_scored_prompt_alone(client, tokenizer, reference):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    body = complete(client, prompt=ids, max_tokens=0, logprobs=0, echo=True)
    choice = body["choices"][0]
    assert choice["text"] == tokenizer.decode(ids)  # a token-id prompt is echoed as its text
    assert choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids)
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(
        expected_prompt_logprobs(reference, ids), abs=ATOL
    )
    assert choice["logprobs"]["top_logprobs"][1:] == [{}] * (len(ids) - 1)
    assert body["usage"]["completion_tokens"] == 0


def test_a_cached_prompt_is_scored_in_full(client, tokenizer, reference):
    ids = tokenizer.encode(PROMPT * 3, add_special_tokens=False)
    complete(client, prompt=ids, max_tokens=1)
    warm = complete(client, prompt=ids, max_tokens=1)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    body = complete(client, prompt=ids, max_tokens=1, logprobs=1, echo=True)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # read again: a hit has no logits
    assert body["choices"][0]["logprobs"]["token_logprobs"][1 : len(ids)] == pytest.approx(
        expected_prompt_logprobs(reference, ids), abs=ATOL
    )


def test_vllm_prompt_logprobs(client, tokenizer, reference):
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    choice = complete(client, prompt=[ids], max_tokens=1, prompt_logprobs=2)["choices"][0]
    assert choice["logprobs"] is None and not choice["text"].startswith(PROMPT)
    got = choice["prompt_logprobs"]
    assert len(got) == len(ids) and got[0] is None
    ref = reference(ids)
    for pos, entry in enumerate(got[1:], start=1):
        own = entry[str(ids[pos])]
        assert own["logprob"] == pytest.approx(ref[pos - 1, ids[pos]].item(), abs=ATOL)
        assert own["rank"] == int((ref[pos - 1] > ref[pos - 1, ids[pos]]).sum()) + 1
        assert own["decoded_token"] == tokenizer.decode([ids[pos]])
        top_ids = ref[pos - 1].topk(2).indices.tolist()
        assert set(entry) == {str(ids[pos]), *map(str, top_ids)}
        assert [entry[str(t)]["rank"] for t in top_ids] == [1, 2]


def test_streamed_echo_concatenates_to_the_non_streamed_choice(client):
    full = complete(client, prompt=PROMPT, max_tokens=4, logprobs=1, echo=True)["choices"][0]
    with client.stream(
        "POST",
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 4,
            "logprobs": 1,
            "echo": True,
            "stream": True,
            "temperature": 0,
        },
    ) as response:
        assert response.status_code == 200
        events = sse_events(response.iter_lines())
    chunks = [json.loads(e["data"])["choices"][0] for e in events[:-1]]
    assert chunks[0]["text"].startswith(PROMPT)
    assert "".join(c["text"] for c in chunks) == full["text"]
    for key in ("tokens", "token_logprobs", "text_offset"):
        assert [v for c in chunks for v in c["logprobs"][key]] == full["logprobs"][key]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"max_tokens": 0}, "max_tokens", "0 is allowed only with echo"),
        ({"prompt_logprobs": 21}, "prompt_logprobs", "prompt_logprobs must be an integer in [0, 20], got 21"),
        ({"prompt_logprobs": "2"}, "prompt_logprobs", "prompt_logprobs must be an integer"),
        ({"echo": "yes"}, "echo", "echo must be true or false"),
        ({"echo": True, "logprobs": 21}, "logprobs", "logprobs must be an integer in [0, 20]"),
    ],
)
def test_scoring_limits_are_400_naming_the_field(client, body, param, fragment):
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"]

"""/v1 routes against the real tiny engine: shapes, greedy consistency, usage, cached tokens and every error case."""

from __future__ import annotations

import json

import openai
import pytest

from tests.app.factories import chat_prompt_ids, make_client, make_tiny_model_dir, sse_events, wait_pool_idle

MODEL = make_tiny_model_dir().name
HELLO = [{"role": "user", "content": "Hello there, how are you?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("openai")) as c:
        yield c


def chat(client, **body):
    return client.post("/v1/chat/completions", json={"model": MODEL, "messages": HELLO, **body})


def stream_chat(client, **body) -> list[dict]:
    with client.stream(
        "POST", "/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "stream": True, **body}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.iter_lines())
    assert events[-1]["data"] == "[DONE]"
    return [json.loads(e["data"]) for e in events[:-1]]


def test_models_lists_the_served_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == 512


def openai_client(client) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=str(client.base_url) + "/v1", api_key="unused", http_client=client, max_retries=0
    )


def test_models_retrieve_gives_the_listed_model_and_404_for_another(client):
    listed = client.get("/v1/models").json()["data"][0]
    assert client.get(f"/v1/models/{MODEL}").json() == listed
    assert openai_client(client).models.retrieve(MODEL).to_dict() == listed
    with pytest.raises(openai.NotFoundError) as error:
        openai_client(client).models.retrieve("org/other-model")  # a hub id's slash reaches the route
    assert error.value.body == {
        "message": f"model 'org/other-model' not found; this server serves '{MODEL}'",
        "type": "not_found_error",
        "param": "model",
        "code": "model_not_found",
    }


SERVED = "GET /v1/models, GET /v1/models/{model_id}, POST /v1/chat/completions, POST /v1/completions, POST /v1/responses"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/embeddings"),
        ("GET", "/v1/responses/resp_1"),  # no response is stored
        ("DELETE", "/v1/responses/resp_1"),
        ("GET", "/v1/nothing"),
    ],
)
def test_endpoints_not_served_are_404_naming_those_served(client, method, path):
    response = client.request(method, path)
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": f"this server does not serve {path}; it serves {SERVED}",
        "type": "not_found_error",
        "param": None,
        "code": "unknown_endpoint",
    }


def test_the_openai_client_reads_why_embeddings_are_not_served(client):
    with pytest.raises(
        openai.NotFoundError, match="this server does not serve /v1/embeddings; it serves GET"
    ):
        openai_client(client).embeddings.create(model=MODEL, input="hello")


def test_chat_completion_shape_and_usage(client):
    response = chat(client, max_tokens=7, temperature=0)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    assert body["id"].startswith("chatcmpl-")
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"  # random weights: EOS within 7 tokens is (almost) impossible
    num_prompt = len(chat_prompt_ids(HELLO))
    usage = body["usage"]
    assert usage["prompt_tokens"] == num_prompt
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == num_prompt + 7
    assert "cached_tokens" in usage["prompt_tokens_details"]


def test_repeated_prompt_reports_cached_full_blocks(client):
    messages = [
        {"role": "user", "content": "A prompt only this test sends, long enough for two blocks of cache."}
    ]
    num_prompt = len(chat_prompt_ids(messages))
    first = client.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 2, "temperature": 0}
    )
    second = client.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 2, "temperature": 0}
    )
    block_size = 16
    # the first request shares only the template's default system prompt with earlier tests; the second hits
    # every full block of its prompt except that the last prompt token is always recomputed
    assert (
        second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        == (num_prompt - 1) // block_size * block_size
    )
    assert first.json()["choices"][0]["message"] == second.json()["choices"][0]["message"]


def test_stream_concatenates_to_the_non_streamed_greedy_text(client):
    full = chat(client, max_tokens=12, temperature=0).json()["choices"][0]["message"]["content"]
    chunks = stream_chat(client, max_tokens=12, temperature=0, stream_options={"include_usage": True})
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    assert text == full
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert all(c["usage"] is None for c in chunks[:-1])
    wait_pool_idle(client)


def test_stream_without_include_usage_has_no_usage_chunk(client):
    chunks = stream_chat(client, max_tokens=3, temperature=0)
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_string_cuts_the_text_and_finishes_with_stop(client):
    chunks = stream_chat(client, max_tokens=10, temperature=0)
    full = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    # a word after the first two (not a delta: how many tokens a delta carries depends on the machine's pace)
    stop = full.split()[2]
    body = chat(client, max_tokens=10, temperature=0, stop=[stop]).json()
    assert body["choices"][0]["message"]["content"] == full[: full.index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


def test_n_samples_with_seed_are_reproducible(client):
    a = chat(client, max_tokens=6, temperature=1.0, n=2, seed=7).json()
    b = chat(client, max_tokens=6, temperature=1.0, n=2, seed=7).json()
    assert [c["index"] for c in a["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in a["choices"]] == [c["message"]["content"] for c in b["choices"]]
    assert a["usage"]["completion_tokens"] == 12


def test_chat_logprobs(client):
    body = chat(client, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    assert "".join(c["token"] for c in content) == body["choices"][0]["message"]["content"]
    for entry in content:
        assert len(entry["top_logprobs"]) == 3
        assert entry["logprob"] == pytest.approx(max(t["logprob"] for t in entry["top_logprobs"]))  # greedy


def test_completions_text_and_stream(client):
    body = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 2},
    ).json()
    assert body["object"] == "text_completion"
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length"
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]
    assert choice["logprobs"]["text_offset"][0] == 0
    assert body["usage"]["completion_tokens"] == 5
    with client.stream(
        "POST",
        "/v1/completions",
        json={"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": True},
    ) as response:
        events = sse_events(response.iter_lines())
    assert events[-1]["data"] == "[DONE]"
    assert "".join(json.loads(e["data"])["choices"][0]["text"] for e in events[:-1]) == choice["text"]


def test_completions_accepts_token_ids(client):
    body = client.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 2}).json()
    assert body["usage"]["prompt_tokens"] == 4


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"temperature": "hot"}, "temperature", "temperature must be a finite number"),
        ({"temperature": -1}, "temperature", "temperature must be in [0, 100], got -1.0"),
        ({"top_p": 0}, "top_p", "top_p must be in (0, 1]"),
        ({"top_k": 1.5}, "top_k", "top_k must be an integer"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be a positive integer, got 0"),
        ({"max_tokens": 500}, "max_tokens", "+ max_tokens (500) exceeds max_model_len (512)"),
        ({"n": 99}, "n", "n must be an integer in [1, 16], got 99"),
        ({"stop": 5}, "stop", "stop must be a string or a list of strings"),
        ({"stop": ["x"] * 17}, "stop", "stop may hold at most 16 strings"),
        ({"seed": -3}, "seed", "seed must be an integer in [0, 2**63)"),
        ({"presence_penalty": 3}, "presence_penalty", "presence_penalty must be in [-2, 2]"),
        ({"top_logprobs": 2}, "top_logprobs", "top_logprobs requires logprobs"),
        (
            {"logprobs": True, "top_logprobs": 50},
            "logprobs",
            "logprobs must be an integer in [0, 20], got 50",
        ),
        ({"messages": []}, "messages", "messages must be a non-empty list"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", "messages[0].role must be one of"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages", "messages[0].content must be a string"),
        ({"stream": "yes"}, "stream", "stream must be true or false"),
        ({"cache_salt": ""}, "cache_salt", "cache_salt must be a non-empty string"),
        ({"cache_salt": 7}, "cache_salt", "cache_salt must be a non-empty string, got 7"),
        ({"cache_salt": "s" * 1025}, "cache_salt", "cache_salt is 1025 characters, over the limit of 1024"),
    ],
)
def test_invalid_parameters_are_400_naming_the_field(client, body, param, fragment):
    response = chat(client, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert fragment in error["message"]


def test_prompt_over_max_model_len_gives_both_numbers(client):
    num_prompt = len(chat_prompt_ids(HELLO))
    response = chat(client, max_tokens=512 - num_prompt + 1)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"prompt ({num_prompt} tokens) + max_tokens ({512 - num_prompt + 1}) exceeds max_model_len (512): "
        "shorten the prompt, lower max_tokens, or start the server with a larger --max-model-len"
    )


def test_unknown_model_is_404(client):
    response = client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": HELLO})
    assert response.status_code == 404
    assert response.json()["error"]["message"] == f"model 'gpt-9' not found; this server serves '{MODEL}'"
    assert response.json()["error"]["param"] == "model"


def test_malformed_bodies_are_400(client):
    for content, fragment in [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b"", "body is empty"),
        (b'{"a": "\xff"}', "not valid UTF-8"),
    ]:
        response = client.post(
            "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, content
        assert fragment in response.json()["error"]["message"]


def test_body_over_the_limit_is_413_with_and_without_content_length(client):
    big = json.dumps({"messages": HELLO, "pad": "x" * (1024 * 1024)}).encode()
    response = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert (
        f"request body of {len(big)} bytes exceeds the limit of 1048576 bytes"
        == response.json()["error"]["message"]
    )

    def chunks():  # no Content-Length: the limit must count the bytes actually received
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    response = client.post(
        "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "request body exceeds the limit of 1048576 bytes"


def test_unknown_route_and_method_use_the_error_shape(client):
    assert client.get("/nothing").json()["error"]["message"] == "no route for GET /nothing"
    response = client.get("/v1/chat/completions")
    assert response.status_code == 405
    assert response.json()["error"]["message"] == "method GET not allowed on /v1/chat/completions"

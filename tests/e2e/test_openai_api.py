"""The official `openai` client against a real server: streaming and not, errors, and a disconnect mid-stream."""

from __future__ import annotations

import httpx
import openai
import pytest

from bench.common.servers import stop_server
from tests.e2e.conftest import server_env, start_server

HELLO = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def model_id(server) -> str:
    return httpx.get(server.base_url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def test_models(client, model_id):
    assert [m.id for m in client.models.list().data] == [model_id]
    assert client.models.retrieve(model_id).id == model_id


def test_chat_completion(client, model_id, server):
    first = client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=6, temperature=0)
    again = client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=6, temperature=0)
    assert first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == 6
    assert first.choices[0].message.content == again.choices[0].message.content
    prompt = first.usage.prompt_tokens
    assert again.usage.prompt_tokens_details.cached_tokens == (prompt - 1) // 16 * 16
    server.wait_pool_idle()


def test_usage_has_the_speculative_counts_and_a_request_can_opt_out(client, model_id, server):
    """`usage.completion_tokens_details` counts the tokens speculative decoding proposed and kept or rejected (the
    tiny random model repeats nothing, so the n-gram method proposes nothing here: tests/engine/test_speculative_exact.py
    counts them on the real model); `speculative: false` is accepted and changes no greedy token."""
    prompt = "one two three four five six seven one two three four five six seven one two three"
    on = client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0)
    off = client.completions.create(
        model=model_id, prompt=prompt, max_tokens=24, temperature=0, extra_body={"speculative": False}
    )
    assert on.choices[0].text == off.choices[0].text
    for reply in (on, off):
        details = reply.usage.completion_tokens_details
        assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, 0)
    with pytest.raises(openai.BadRequestError, match="speculative"):
        client.completions.create(
            model=model_id, prompt=prompt, max_tokens=2, extra_body={"speculative": "no"}
        )
    server.wait_pool_idle()


def test_streaming_chat_matches_the_non_streamed_text(client, model_id):
    full = client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(
        model=model_id,
        messages=HELLO,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completions_streaming_and_not(client, model_id):
    done = client.completions.create(model=model_id, prompt="The cat", max_tokens=5, temperature=0)
    parts = client.completions.create(
        model=model_id, prompt="The cat", max_tokens=5, temperature=0, stream=True
    )
    assert "".join(p.choices[0].text for p in parts) == done.choices[0].text
    assert done.usage.completion_tokens == 5


def test_completions_echo_scores_the_prompt(client, model_id, server):
    echo = client.completions.create(
        model=model_id, prompt="The cat sat on the mat", max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    [choice] = echo.choices
    assert choice.text == "The cat sat on the mat" and echo.usage.completion_tokens == 0
    block = choice.logprobs
    assert "".join(block.tokens) == choice.text and len(block.tokens) == echo.usage.prompt_tokens
    assert block.token_logprobs[0] is None and all(lp <= 0 for lp in block.token_logprobs[1:])
    vllm = client.completions.create(
        model=model_id, prompt="The cat sat on the mat", max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    scores = vllm.choices[0].model_extra["prompt_logprobs"]
    assert [next(iter(s.values()))["logprob"] if s else None for s in scores] == block.token_logprobs
    server.wait_pool_idle()


def test_responses_streaming_and_not(client, model_id, server):
    done = client.responses.create(
        model=model_id, instructions="Be brief.", input="Say something.", max_output_tokens=6, temperature=0
    )
    chat = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        max_tokens=6,
        temperature=0,
    )
    assert done.output_text == chat.choices[0].message.content
    assert done.usage.input_tokens == chat.usage.prompt_tokens and done.usage.output_tokens == 6
    events = list(
        client.responses.create(
            model=model_id,
            instructions="Be brief.",
            input="Say something.",
            max_output_tokens=6,
            temperature=0,
            stream=True,
        )
    )
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == done.output_text == events[-1].response.output_text
    server.wait_pool_idle()


def test_embeddings_stay_a_404_naming_the_served_routes(client, model_id):
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model=model_id, input="hello")
    assert "this server does not serve /v1/embeddings; it serves" in missing.value.body["message"]
    assert "POST /v1/completions, POST /v1/responses" in missing.value.body["message"]


def test_error_cases_name_the_problem(client, model_id, server):
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model_id, messages=HELLO, temperature=-2)
    assert bad.value.status_code == 400
    assert bad.value.body["param"] == "temperature"
    assert "temperature must be in [0, 100], got -2.0" in bad.value.body["message"]

    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=100_000)
    assert "+ max_tokens (100000) exceeds max_model_len (512)" in long.value.body["message"]

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-nope", messages=HELLO)
    assert missing.value.body["message"] == f"model 'gpt-nope' not found; this server serves '{model_id}'"

    huge = httpx.post(
        server.base_url + "/v1/chat/completions",
        content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
        headers={"content-type": "application/json"},
    )
    assert huge.status_code == 413
    assert "exceeds the limit of 1048576 bytes" in huge.json()["error"]["message"]


def test_disconnect_mid_stream_aborts_and_frees_every_block(server):
    body = {"messages": HELLO, "max_tokens": 400, "temperature": 0, "stream": True}
    with (
        httpx.Client(base_url=server.base_url, timeout=30) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()  # kept referenced: a closed line iterator closes the connection
        received = 0
        while received < 3:
            received += next(lines).startswith("data: {")
        busy = server.admin_state()
        assert "u" in busy["block_states"] and len(busy["sequences"]) == 1
    # leaving the with-blocks closes the connection: the server must abort at its next step
    idle = server.wait_pool_idle()
    assert idle["stats"]["num_used_blocks"] == 0
    metrics = httpx.get(server.base_url + "/metrics").text
    assert 'finished_reason="abort"' in metrics


def test_disconnect_during_a_non_streamed_request_aborts_it(server):
    generated_before = server.wait_pool_idle()["stats"]["num_generation_tokens_total"]
    body = {"messages": HELLO, "max_tokens": 450, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after 0.2 s and closes the connection
        httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.2))
    idle = server.wait_pool_idle()
    assert idle["stats"]["num_generation_tokens_total"] - generated_before < 450


def test_keys_and_queue_limit_on_a_locked_server(tmp_path, tiny_model):
    env = server_env(
        tmp_path,
        tiny_model,
        PAGEDCHAT_API_KEYS="sk-e2e",
        PAGEDCHAT_MAX_NUM_SEQS="1",
        PAGEDCHAT_MAX_QUEUED_REQUESTS="0",
    )
    locked = start_server(tmp_path, env)
    try:
        base = locked.base_url + "/v1"
        with pytest.raises(openai.AuthenticationError) as denied:
            openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
        assert denied.value.status_code == 401 and denied.value.body["message"] == "invalid API key"
        client = openai.OpenAI(base_url=base, api_key="sk-e2e", max_retries=0)
        model_id = client.models.list().data[0].id
        stream = client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=400, stream=True)
        next(iter(stream))
        with pytest.raises(openai.APIStatusError) as busy:
            client.chat.completions.create(model=model_id, messages=HELLO, max_tokens=2)
        assert busy.value.status_code == 503
        assert busy.value.response.headers["retry-after"] == "1"
        assert "limit of 1 concurrent requests" in busy.value.body["message"]
        stream.close()
        raw = httpx.get(locked.base_url + "/metrics")
        assert raw.status_code == 200
        locked.wait_pool_idle()
        assert (
            client.chat.completions.create(
                model=model_id, messages=HELLO, max_tokens=2
            ).usage.completion_tokens
            == 2
        )
    finally:
        stop_server(locked)
    assert "Application shutdown complete." in locked.log()
    assert "sk-e2e" not in locked.log()  # keys never reach the logs

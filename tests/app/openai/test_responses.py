"""/v1/responses (the Responses API's text subset) with the official `openai` client: the same reply as the chat
completion it stands for, streamed in OpenAI's events or not; unsupported fields are 400s naming them; the same
keys and limits as /v1/chat/completions."""

from __future__ import annotations

import openai
import pytest

from tests.app.factories import make_client, make_tiny_model_dir

MODEL = make_tiny_model_dir().name
EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("responses")) as c:
        yield c


def sdk(client, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=str(client.base_url) + "/v1", api_key=api_key, http_client=client, max_retries=0
    )


def chat_reply(client, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    reply = sdk(client).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0
    )
    return reply.choices[0].message.content, reply.usage.prompt_tokens


def test_a_string_input_gets_the_chat_completions_reply(client):
    response = sdk(client).responses.create(
        model=MODEL, input="Hello there!", max_output_tokens=6, temperature=0
    )
    text, prompt_tokens = chat_reply(client, [{"role": "user", "content": "Hello there!"}], 6)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == text
    [item] = response.output
    assert (item.type, item.role, item.content[0].type, item.content[0].annotations) == (
        "message",
        "assistant",
        "output_text",
        [],
    )
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == prompt_tokens and response.usage.output_tokens == 6
    assert response.usage.total_tokens == prompt_tokens + 6
    assert response.usage.input_tokens_details.cached_tokens >= 0


def test_instructions_and_message_items_are_the_chat_messages(client):
    response = sdk(client).responses.create(
        model=MODEL,
        instructions="Answer briefly.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"},
        ],
        max_output_tokens=5,
        temperature=0,
        top_p=0.9,
    )
    text, prompt_tokens = chat_reply(
        client,
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"},
        ],
        5,
    )
    assert response.output_text == text and response.usage.input_tokens == prompt_tokens
    assert response.instructions == "Answer briefly." and response.top_p == 0.9


def test_stream_sends_openais_events_and_the_same_text(client):
    full = sdk(client).responses.create(
        model=MODEL, input="Tell me a story.", max_output_tokens=8, temperature=0
    )
    events = list(
        sdk(client).responses.create(
            model=MODEL, input="Tell me a story.", max_output_tokens=8, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == EVENTS and kinds[-4:] == [*CLOSING, "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == full.output_text == events[-4].text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 8 and final.status == "incomplete"
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_the_sdk_stream_helper_accumulates_the_response(client):
    with sdk(client).responses.stream(model=MODEL, input="Hi", max_output_tokens=4, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas)


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "tools is not supported by this server"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "/v1/responses does not accept it"),
        ({"store": True}, "store", "this server keeps no responses"),
        ({"reasoning": {"effort": "low"}}, "reasoning", "unknown field"),
        ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be a positive integer"),
        ({"temperature": -1}, "temperature", "temperature must be in [0, 100]"),
    ],
)
def test_unsupported_fields_are_400_naming_them(client, extra, param, fragment):
    response = client.post("/v1/responses", json={"model": MODEL, "input": "Hi", **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "input is empty"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], '"input_image" is not'),
        ([{"type": "function_call_output", "call_id": "c", "output": "1"}], "only message items"),
        ([{"role": "tool", "content": "x"}], "input[0].role must be one of"),
    ],
)
def test_input_other_than_text_messages_is_400_naming_input(client, value, fragment):
    response = client.post("/v1/responses", json={"model": MODEL, "input": value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "input" and fragment in response.json()["error"]["message"]


def test_keys_and_limits_are_those_of_chat_completions(tmp_path):
    with make_client(tmp_path, api_keys=("sk-resp",), client_requests_per_minute=2) as keyed:
        with pytest.raises(openai.AuthenticationError):
            sdk(keyed, "sk-wrong").responses.create(model=MODEL, input="Hi", max_output_tokens=2)
        for _ in range(2):
            assert sdk(keyed, "sk-resp").responses.create(model=MODEL, input="Hi", max_output_tokens=2).usage
        with pytest.raises(openai.RateLimitError):
            sdk(keyed, "sk-resp").responses.create(model=MODEL, input="Hi", max_output_tokens=2)

"""Structured output through the official `openai` client against the app (tiny random model): response_format
json_schema / json_object, vLLM's guided_regex / guided_grammar, streamed and not, the session API, and the 400s."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.app.factories import make_client, make_tiny_model_dir, sse_events

MODEL = make_tiny_model_dir().name
HELLO = [{"role": "user", "content": "Give me a color as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "color", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("structured")) as c:
        yield c


@pytest.fixture(scope="module")
def client(app_client) -> openai.OpenAI:
    """The official client, speaking to the app through the test client's transport."""
    return openai.OpenAI(
        base_url=str(app_client.base_url) + "/v1", api_key="unused", http_client=app_client, max_retries=0
    )


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 1), (1.0, 2)])
def test_json_schema_reply_validates(client, temperature, seed):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        response_format=FORMAT,
        max_tokens=150,
        temperature=temperature,
        seed=seed,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_streamed_json_schema_reply_validates(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        response_format=FORMAT,
        max_tokens=150,
        temperature=1.0,
        seed=4,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_reply_is_an_object_or_cut_by_length(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, response_format={"type": "json_object"}, max_tokens=30, temperature=0
    )
    text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert text.startswith("{"), text
    if reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert reason == "length" and reply.usage.completion_tokens == 30


def test_completions_with_guided_regex_and_grammar(client):
    regex = client.completions.create(
        model=MODEL, prompt="Code:", max_tokens=20, extra_body={"guided_regex": r"[A-Z]{2}-[0-9]{3}"}
    )
    assert regex.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", regex.choices[0].text)
    stream = client.completions.create(
        model=MODEL,
        prompt="Answer:",
        max_tokens=20,
        stream=True,
        extra_body={"guided_grammar": 'start: "yes" | "no"'},
    )
    parts = list(stream)
    assert "".join(p.choices[0].text for p in parts if p.choices) in ("yes", "no")
    assert [p.choices[0].finish_reason for p in parts if p.choices][-1] == "stop"


def test_text_response_format_is_unconstrained(client):
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5, temperature=0)
    text = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=5, temperature=0, response_format={"type": "text"}
    )
    assert text.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            },
            "response_format",
            "invalid JSON schema: Invalid type: foo",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format", "response_format.type must be one of"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "response_format.json_schema.schema must be a JSON schema object",
        ),
        ({"response_format": "json"}, "response_format", "response_format must be an object"),
        ({"guided_regex": "a(b"}, "guided_regex", "unclosed group"),
        (
            {"guided_regex": "a{100000}"},
            "guided_regex",
            "asks for 100000 repetitions ('{100000}'), over the limit of 2000",
        ),
        ({"guided_grammar": "start: foo"}, "guided_grammar", 'unknown name: "foo"'),
        ({"guided_json": "{bad"}, "guided_json", "guided_json is not valid JSON"),
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            "guided_regex",
            "only one of response_format, guided_json, guided_regex, guided_grammar",
        ),
        (
            {"response_format": {"type": "json_object"}, "stop": ["}"]},
            "stop",
            "stop cannot be combined with structured output",
        ),
    ],
)
def test_bad_constraints_are_400_naming_the_field(client, extra, param, fragment):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5, extra_body=extra)
    error = info.value.body
    assert fragment in error["message"], error
    assert error["param"] == param


def test_session_replies_follow_the_session_response_format(app_client):
    settings = {"temperature": 0, "max_tokens": 150, "response_format": FORMAT}
    created = app_client.post("/api/sessions", json={"settings": settings})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    with app_client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "A color?"}) as response:
        assert response.status_code == 200, response.read()
        events = [json.loads(e["data"]) for e in sse_events(response.iter_lines())]
    done = events[-1]
    assert done["type"] == "done" and done["message"]["finish_reason"] == "stop", done
    jsonschema.validate(json.loads(done["message"]["content"]), SCHEMA)
    bad = {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}}
    response = app_client.patch(f"/api/sessions/{sid}", json={"settings": bad})
    assert response.status_code == 400
    assert "Invalid type: foo" in response.json()["error"]["message"]

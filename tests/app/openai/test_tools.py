"""Tools on /v1/chat/completions through the official `openai` client against the app: forced calls (required and
named) whose arguments validate against the tool's schema, streamed and not; tool conversations; the 400s; and
tools refused on a chat template without tool support (the default SmolLM2 template)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from app.http.errors import APIError
from app.openai.input import render_chat, tools_refusal
from tests.app.factories import TOOLS_TEMPLATE, make_client, make_tiny_model_dir, make_tiny_tools_model_dir

MODEL = make_tiny_tools_model_dir().name
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


def openai_client(app_client) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=str(app_client.base_url) + "/v1", api_key="unused", http_client=app_client, max_retries=0
    )


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("tools"), model=str(make_tiny_tools_model_dir())) as c:
        yield c


@pytest.fixture(scope="module")
def client(app_client) -> openai.OpenAI:
    return openai_client(app_client)


def check_calls(calls, names) -> None:
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize(
    ("tool_choice", "names"),
    [("required", {"get_weather", "add"}), ({"type": "function", "function": {"name": "add"}}, {"add"})],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_forced_call_validates(client, tool_choice, names, seed):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=1.0,
        seed=seed,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    check_calls(choice.message.tool_calls, names)


def test_forced_parallel_calls_validate(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=240, temperature=0
    )
    choice = reply.choices[0]
    if choice.finish_reason == "tool_calls":
        check_calls(choice.message.tool_calls, set(SCHEMAS))
    else:  # the random model went on calling until max_tokens: the open call is content
        assert choice.finish_reason == "length"
        check_calls(choice.message.tool_calls, set(SCHEMAS))
        assert choice.message.content.startswith("<tool_call>")


def test_streamed_forced_call_matches_the_unstreamed_one(client):
    args = dict(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=0,
    )
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls[0]
    chunks = [c for c in client.chat.completions.create(**args, stream=True) if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert (
        deltas[0].index == 0 and deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    )
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == json.loads(whole.function.arguments)
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_a_tool_conversation_renders_and_auto_replies(client):
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.prompt_tokens > 100  # the tool schemas and the call's result were rendered


def test_tool_choice_none_does_not_render_the_tools(client):
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0)
    none = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0
    )
    auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4, temperature=0)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens
    assert none.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"tools": {"a": 1}}, "tools must be a non-empty list"),
        ({"tools": [{"type": "retrieval"}]}, 'tools[0].type must be "function"'),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters must be a JSON schema object",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "required": 3}},
                    }
                ]
            },
            "tools[0].function.parameters is not a valid JSON schema",
        ),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice must be one of"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls must be true or false"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "cannot be combined",
        ),
    ],
)
def test_bad_tools_are_400_naming_the_field(app_client, extra, fragment):
    response = app_client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error["message"]
    named = [k for k in ("tools", "tool_choice", "parallel_tool_calls") if k in extra]
    expected = "tool_choice" if "cannot be combined" in fragment else named[-1]
    assert error["param"] == expected


def test_tools_on_a_template_without_tool_support_are_400(tmp_path):
    with make_client(tmp_path) as app_client:
        response = app_client.post(
            "/v1/chat/completions",
            json={"model": make_tiny_model_dir().name, "messages": ASK, "tools": TOOLS, "max_tokens": 2},
        )
        assert response.status_code == 400, response.text
        assert "chat template has no tool support" in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "tools"


LLAMA31_LIKE = (  # renders tools, but writes calls as bare JSON: a format the parser does not read
    "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
    '{"name": ..., "parameters": ...}'
)


@pytest.mark.parametrize(
    ("template", "refusal"),
    [
        (None, "has no tool support"),
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "has no tool support"),
        (LLAMA31_LIKE, "not written as <tool_call>"),
        ({"default": "{{ messages }}", "tool_use": TOOLS_TEMPLATE}, None),  # Hermes' named templates
        ({"default": "{{ messages }}"}, "has no tool support"),
        ("{% generation %}{{ tools }}<tool_call>{% endgeneration %}", None),  # a tag only transformers knows
        (TOOLS_TEMPLATE, None),
    ],
)
def test_tools_are_offered_only_where_the_template_writes_calls_the_parser_reads(template, refusal):
    got = tools_refusal(template)
    assert got is None if refusal is None else refusal in got


def test_a_template_that_refuses_the_conversation_is_a_400_naming_messages(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(make_tiny_tools_model_dir())
    tok.chat_template = "{{ raise_exception('tool call ids must be 9 characters') }}"
    with pytest.raises(APIError) as refused:
        render_chat(tok, ASK, TOOLS)
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert "refused the conversation: tool call ids must be 9 characters" in refused.value.message


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        (
            {"response_format": {"type": "json_object"}},
            "parallel_tool_calls",
            "cannot be combined with an output",
        ),
        (
            {"stop": [f"s{i}" for i in range(16)]},
            "stop",
            "at most 15 strings with parallel_tool_calls: false",
        ),
    ],
)
def test_a_single_auto_call_names_what_its_own_stop_string_conflicts_with(app_client, extra, param, fragment):
    body = {"messages": ASK, "max_tokens": 2, "tools": TOOLS, "parallel_tool_calls": False, **extra}
    response = app_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"]

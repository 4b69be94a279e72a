"""Hypothesis strategies for hostile input: odd scalars, nested JSON, mutated request bodies, raw bytes, frames.

VALID holds plausible values of each field, so that a good share of the generated inputs is valid and must be
served; the rest must be refused with a 4xx naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from app.chat.chat_settings import SESSION_SAMPLING_KEYS
from tests.app.factories import make_tiny_model_dir

MAX_CHARS = 2000
MAX_BODY = 32 * 1024
SAMPLING_FIELDS = SESSION_SAMPLING_KEYS  # the settings a session accepts, as the service defines them
V1_FIELDS = (
    *SAMPLING_FIELDS,
    "model",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "stop_token_ids",
    "ignore_eos",
    "max_completion_tokens",
)

huge_numbers = st.sampled_from([2**31, 2**63, 2**64 + 1, -(2**63), 10**30, 1e308, -1e308, 1e-320])
odd_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [float("nan"), float("inf"), -0.0]
)
odd_strings = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "\ud800",
        "a\udfffb",
        "x" * (MAX_CHARS + 1),
        "é" * 40,
        "</script><script>alert(1)</script>",
    ]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 20)
    | huge_numbers
    | odd_floats
    | st.text(max_size=12)
    | odd_strings
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
valid_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(max_size=40)}
    ),
    min_size=1,
    max_size=4,
)
messages = st.one_of(
    valid_messages,
    valid_messages,
    st.just([]),
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "", 3])},
            optional={"content": json_values | odd_strings, "name": json_values},
        ),
        min_size=1,
        max_size=4,
    ),
    json_values,
)


short_text = st.text(min_size=1, max_size=4)
VALID = {  # plausible values of each field, so that a good share of the inputs is valid and must be served
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 100),
    "min_p": st.floats(0, 1),
    "max_tokens": st.integers(1, 8),
    "max_completion_tokens": st.integers(1, 8),
    "stop": short_text | st.lists(short_text, max_size=3),
    "seed": st.integers(0, 2**63 - 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "model": st.just(make_tiny_model_dir().name),
    "n": st.integers(1, 3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logprobs": st.booleans() | st.integers(0, 5),
    "top_logprobs": st.integers(0, 5),
    "stop_token_ids": st.lists(st.integers(0, 49151), max_size=3),
    "ignore_eos": st.booleans(),
}


def mutations(fields: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """Some known fields set to valid or hostile values, and maybe an unknown field."""
    names = st.lists(st.sampled_from(fields), unique=True, max_size=3)
    known = names.flatmap(
        lambda chosen: st.fixed_dictionaries({n: VALID.get(n, st.nothing()) | json_values for n in chosen})
    )
    unknown = st.dictionaries(
        st.sampled_from(["frobnicate", "user", "metadata", "__proto__"]), json_values, max_size=1
    )
    return st.tuples(known, unknown).map(lambda kv: {**kv[0], **kv[1]})


prompts = st.one_of(
    st.text(min_size=1, max_size=30),
    st.lists(st.integers(0, 49151), min_size=1, max_size=6),
    st.text(max_size=30),
    odd_strings,
    st.lists(st.integers(-5, 60000) | huge_numbers, max_size=6),
    st.lists(st.text(max_size=5), max_size=3),
    json_values,
)


raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"\xff\xfe{}",
            b'{"messages": [',
            b"[" * 50_000 + b"]" * 50_000,
            b'{"a": "\xc3\x28"}',
            b"null",
            b"1e999999",
            b'{"max_tokens": 1' + b"0" * 5000 + b"}",
            b'{"content": "' + b"x" * (MAX_BODY + 10) + b'"}',
        ]
    ),
)
JSON_ENDPOINTS = (
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/api/sessions"),
    ("PATCH", "/api/sessions/{sid}"),
    ("POST", "/api/sessions/{sid}/messages"),
    ("POST", "/api/sessions/{sid}/edit"),
)


session_settings = mutations(SAMPLING_FIELDS)


frames = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["message", "edit", "regenerate", "stop", "ping", "dance", ""])
            | json_values
        },
        optional={
            "content": st.text(min_size=1, max_size=20) | json_values | odd_strings,
            "extra": json_values,
        },
    ),
    json_values,
)


def dumps(body: Any) -> bytes:
    """JSON bytes as a hostile client may send them: NaN and Infinity literals, escaped lone surrogates."""
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")

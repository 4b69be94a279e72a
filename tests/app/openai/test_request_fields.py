"""Nothing a client sends is silently ignored: each field /v1/chat/completions and /v1/completions do not serve is a
400 naming it; the no-op values of OpenAI's unserved fields and the informational `user` pass."""

from __future__ import annotations

import pytest

from tests.app.factories import make_client

HELLO = [{"role": "user", "content": "Hi"}]
CHAT = {"messages": HELLO, "max_tokens": 2}
COMPLETION = {"prompt": "Hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("fields")) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "base", "extra", "param", "fragment"),
    [
        ("/v1/chat/completions", CHAT, {"frobnicate": 1}, "frobnicate", "unknown field 'frobnicate'"),
        ("/v1/chat/completions", CHAT, {"functions": []}, "functions", "does not accept it"),
        ("/v1/chat/completions", CHAT, {"metadata": {"a": "b"}}, "metadata", "unknown field"),
        ("/v1/chat/completions", CHAT, {"store": False}, "store", "unknown field"),
        ("/v1/chat/completions", CHAT, {"logit_bias": {"5": 1}}, "logit_bias", "unknown field"),
        ("/v1/chat/completions", CHAT, {"echo": False}, "echo", "unknown field"),
        ("/v1/chat/completions", CHAT, {"user": 7}, "user", "user must be a string"),
        (
            "/v1/chat/completions",
            CHAT,
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options",
            "stream_options.continuous_usage_stats is not supported",
        ),
        (
            "/v1/chat/completions",
            CHAT,
            {"stream_options": {"include_usage": True}},
            "stream_options",
            "only allowed when stream is true",
        ),
        ("/v1/completions", COMPLETION, {"frobnicate": None}, "frobnicate", "unknown field"),
        ("/v1/completions", COMPLETION, {"top_logprobs": 2}, "top_logprobs", "unknown field"),
        ("/v1/completions", COMPLETION, {"max_completion_tokens": 2}, "max_completion_tokens", "unknown"),
        (
            "/v1/completions",
            COMPLETION,
            {"logit_bias": {"5": 1}},
            "logit_bias",
            "logit_bias is not supported",
        ),
        ("/v1/completions", COMPLETION, {"suffix": "end"}, "suffix", "suffix is not supported"),
        ("/v1/completions", COMPLETION, {"best_of": 3}, "best_of", "best_of is not supported"),
        ("/v1/completions", COMPLETION, {"tools": []}, "tools", "unknown field"),
    ],
)
def test_unserved_fields_are_400_naming_them(client, path, base, extra, param, fragment):
    response = client.post(path, json={**base, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert fragment in error["message"]


@pytest.mark.parametrize(
    ("path", "base", "extra"),
    [
        ("/v1/chat/completions", CHAT, {"user": "alice"}),
        ("/v1/chat/completions", CHAT, {"parallel_tool_calls": True, "tool_choice": "none"}),
        ("/v1/completions", COMPLETION, {"echo": False, "best_of": 1, "logit_bias": {}, "suffix": ""}),
        ("/v1/completions", COMPLETION, {"n": 2, "best_of": 2, "user": "bob"}),
        ("/v1/completions", COMPLETION, {"echo": None, "suffix": None, "logit_bias": None}),
    ],
)
def test_no_op_values_and_user_pass(client, path, base, extra):
    response = client.post(path, json={**base, **extra})
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == extra.get("n", 1)

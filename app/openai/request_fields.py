"""Which request fields /v1/chat/completions and /v1/completions accept: every other field is a 400 naming it, so
nothing a client sends is silently ignored (docs/users/api.md's "Request fields" table says what each one does)."""

from __future__ import annotations

import json
from typing import Any

from app.http.errors import bad_request

_COMMON = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "n",
        "seed",
        "logprobs",
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_grammar",
        "cache_salt",
        "user",  # informational: written to the request's log line
        "return_progress",  # llama.cpp's: a stream sends prompt_progress chunks before the first token
        "speculative",  # pagedchat's: false, this request takes no speculative tokens
    }
)
CHAT_FIELDS = _COMMON | {
    "messages",
    "top_logprobs",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
}
# prompt_logprobs: vLLM's (app/openai/echo.py)
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "prompt_logprobs", "best_of", "logit_bias", "suffix"}
# OpenAI fields this server knows but does not serve: a value other than the no-op one is a 400 saying so
_NO_OP = {
    "logit_bias": ({},),
    "suffix": ("",),
}
STREAM_OPTIONS = frozenset({"include_usage"})
MAX_USER_CHARS = 256


def check_fields(body: dict[str, Any], kind: str) -> str | None:
    """400 naming the first field the endpoint does not serve (null counts as absent only for known fields);
    returns the `user` string, if any, for the log line."""
    known = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
    endpoint = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    for name in body:
        if name not in known:
            raise bad_request(f"unknown field {name[:80]!r}: {endpoint} does not accept it", name[:80])
    for name, no_op in _NO_OP.items():
        value = body.get(name)
        if value is not None and not any(value == v and type(value) is type(v) for v in no_op):
            raise bad_request(f"{name} is not supported by this server (got {json.dumps(value)[:80]})", name)
    best_of = body.get("best_of")
    if best_of is not None and best_of != (body.get("n") or 1):
        raise bad_request(
            f"best_of is not supported by this server: only best_of equal to n is served, got "
            f"{json.dumps(best_of)[:80]}",
            "best_of",
        )
    options = body.get("stream_options")
    if isinstance(options, dict):
        for name in options:
            if name not in STREAM_OPTIONS:
                raise bad_request(
                    f"stream_options.{name[:80]} is not supported; stream_options accepts include_usage",
                    "stream_options",
                )
        if options and body.get("stream") is not True:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    user = body.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_CHARS):
        raise bad_request(f"user must be a string of at most {MAX_USER_CHARS} characters", "user")
    return user

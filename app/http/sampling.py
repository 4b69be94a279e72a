"""Reading sampling fields from a JSON object: typed values with errors naming their field, and SamplingParams."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from app.http.errors import bad_request
from app.http.response_format import structured_output
from engine.core.limits import check_max_tokens
from engine.core.sequence import MAX_STOP_STRINGS, SamplingParams
from engine.core.structured import StructuredOutput

_SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


def get_number(body: dict[str, Any], name: str, default: float | None) -> float | None:
    """A finite number field (null means default)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"{name} must be a finite number, got {json.dumps(value)[:80]}", name)
    return float(value)


def get_int(body: dict[str, Any], name: str, default: int | None) -> int | None:
    """An integer field (null means default); 2.0 is accepted as 2."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer, got {json.dumps(value)[:80]}", name)
    return value


def get_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean field (null means default)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, got {json.dumps(value)[:80]}", name)
    return value


def get_str(body: dict[str, Any], name: str, default: str | None, *, max_chars: int) -> str | None:
    """A string field of bounded length (null means default)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string, got {json.dumps(value)[:80]}", name)
    if len(value) > max_chars:
        raise bad_request(f"{name} is {len(value)} characters long, over the limit of {max_chars}", name)
    return value


def get_stop(body: dict[str, Any]) -> tuple[str, ...]:
    """`stop`: a string, a list of strings, or null."""
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise bad_request(f"stop must be a string or a list of strings, got {json.dumps(value)[:80]}", "stop")


def sampling_params(
    body: dict[str, Any],
    *,
    max_tokens: int,
    logprobs: int | None,
    defaults: dict[str, Any] | None = None,
    forced: StructuredOutput | None = None,
    extra_stop: tuple[str, ...] = (),
) -> SamplingParams:
    """SamplingParams from the OpenAI sampling fields; any invalid value is a 400 naming its field. `forced` is a
    forced tool call's grammar (then no other constraint may be given), `extra_stop` stop strings of the server's
    own (a single tool call ends at its closing marker)."""
    d = defaults or {}
    stop_token_ids = body.get("stop_token_ids")
    if stop_token_ids is not None and not (
        isinstance(stop_token_ids, list)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in stop_token_ids)
    ):
        raise bad_request("stop_token_ids must be a list of integers", "stop_token_ids")
    structured = structured_output(body)
    if forced is not None:
        if structured is not None:
            raise bad_request(
                "tool_choice forces a tool call, which cannot be combined with another output constraint "
                "(response_format, guided_*)",
                "tool_choice",
            )
        structured = forced
    stop = get_stop(body) if "stop" in body else tuple(d.get("stop", ()))
    if extra_stop and structured is not None:
        raise bad_request(
            "parallel_tool_calls: false ends the reply at its first tool call's closing marker (a stop string of the "
            "server's), which cannot be combined with an output constraint (response_format, guided_*)",
            "parallel_tool_calls",
        )
    if extra_stop and len(stop) <= MAX_STOP_STRINGS < len(stop) + len(extra_stop):
        raise bad_request(
            f"stop may hold at most {MAX_STOP_STRINGS - len(extra_stop)} strings with parallel_tool_calls: false "
            f"(the server adds {len(extra_stop)} of its own), got {len(stop)}",
            "stop",
        )
    try:
        return SamplingParams(
            temperature=get_number(body, "temperature", d.get("temperature", 1.0)),
            top_p=get_number(body, "top_p", d.get("top_p", 1.0)),
            top_k=get_int(body, "top_k", d.get("top_k", 0)),
            min_p=get_number(body, "min_p", d.get("min_p", 0.0)),
            repetition_penalty=get_number(body, "repetition_penalty", d.get("repetition_penalty", 1.0)),
            presence_penalty=get_number(body, "presence_penalty", d.get("presence_penalty", 0.0)),
            frequency_penalty=get_number(body, "frequency_penalty", d.get("frequency_penalty", 0.0)),
            max_tokens=max_tokens,
            stop=stop + extra_stop,
            stop_token_ids=tuple(stop_token_ids or ()),
            ignore_eos=get_bool(body, "ignore_eos", False),
            speculative=get_bool(body, "speculative", True),
            n=get_int(body, "n", 1),
            seed=get_int(body, "seed", d.get("seed")),
            logprobs=logprobs,
            structured=structured,
        )
    except ValueError as exc:
        message = str(exc)
        field = message.split(" ", 1)[0]
        if field not in _SAMPLING_FIELDS:
            field = next((f for f in _SAMPLING_FIELDS if f" {f} " in f" {message} "), None)
        raise bad_request(message, field) from None


def resolve_max_tokens(
    requested: int | None, num_prompt_tokens: int, max_model_len: int, *, prompt_param: str
) -> int:
    """max_tokens checked against the context window; when absent, whatever room the prompt leaves."""
    if requested is not None and requested < 1:
        raise bad_request(f"max_tokens must be a positive integer, got {requested}", "max_tokens")
    if requested is None:
        if num_prompt_tokens >= max_model_len:
            raise bad_request(
                f"prompt ({num_prompt_tokens} tokens) leaves no room to generate within max_model_len "
                f"({max_model_len}): shorten the prompt (leave out earlier messages) or start the server with a "
                "larger --max-model-len",
                prompt_param,
            )
        return max_model_len - num_prompt_tokens
    try:
        check_max_tokens(num_prompt_tokens, requested, max_model_len)
    except ValueError as exc:
        raise bad_request(str(exc), "max_tokens") from None
    return requested

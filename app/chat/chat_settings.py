"""A chat's settings: the rules a chat's or a preset's sampling settings follow, and what a turn uses when the chat
leaves a field unset (its preset's value, else the server's default)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from app.db import PresetRecord, SessionRecord
from app.http.errors import APIError, bad_request
from app.http.sampling import sampling_params
from engine.core.sampling_defaults import default_sources, effective_defaults

if TYPE_CHECKING:
    from app.engine_client.protocol import EngineInfo
    from app.settings import Settings

SESSION_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "response_format",
)
# the served model a chat (or preset) runs on, by id; unset: the server's --model (app/http/model_registry.py)
MODEL_KEY = "model"
MAX_MODEL_ID_CHARS = 200
CHAT_SETTING_KEYS = (*SESSION_SAMPLING_KEYS, MODEL_KEY)
# The chat page offers temperature 0 to 2 (OpenAI's range); chats and presets hold that. The /v1 API takes up to
# SamplingParams' 100, as some engines do, for clients that want it.
CHAT_TEMPERATURE_RANGE = (0.0, 2.0)


def check_session_settings(value: Any, default_max_tokens: int) -> dict[str, Any]:
    """A chat's or a preset's sampling settings: known keys only, each valid as a sampling parameter and within the
    chat page's ranges; a 400 naming `settings.<field>` and its limit otherwise."""
    if not isinstance(value, dict):
        raise bad_request("settings must be an object", "settings")
    unknown = sorted(k for k in value if k not in CHAT_SETTING_KEYS)
    if unknown:
        raise bad_request(
            f"settings.{unknown[0][:60]} is not a known setting; known: {', '.join(CHAT_SETTING_KEYS)}",
            "settings",
        )
    model = value.get(MODEL_KEY)
    # a string, not checked against the models served now: a chat keeps naming a model that goes away
    if model is not None and not (isinstance(model, str) and 0 < len(model) <= MAX_MODEL_ID_CHARS):
        raise bad_request(
            f"settings.model must be a model id of 1 to {MAX_MODEL_ID_CHARS} characters, got "
            f"{json.dumps(model)[:80]}",
            "settings.model",
        )
    max_tokens = value.get("max_tokens", default_max_tokens)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise bad_request(
            f"settings.max_tokens must be a positive integer, got {json.dumps(max_tokens)[:40]}",
            "settings.max_tokens",
        )
    low, high = CHAT_TEMPERATURE_RANGE
    temperature = value.get("temperature")
    # a number out of the chat's range; any other value is SamplingParams' to name
    if (
        isinstance(temperature, (int, float))
        and not isinstance(temperature, bool)
        and not low <= temperature <= high
    ):
        raise bad_request(
            f"settings.temperature must be in [{low:g}, {high:g}] for a chat, got {temperature:g}",
            "settings.temperature",
        )
    try:
        sampling_params(
            {k: v for k, v in value.items() if k != MODEL_KEY}, max_tokens=max_tokens, logprobs=None
        )
    except APIError as exc:
        raise bad_request(
            f"settings.{exc.message}", f"settings.{exc.param}" if exc.param else "settings"
        ) from None
    return dict(value)


def chat_max_tokens(default_max_tokens: int, max_model_len: int) -> int:
    """What a chat reply may generate when neither the chat nor its preset sets max_tokens (half the context at
    most: the history needs the rest)."""
    return min(default_max_tokens, max_model_len // 2)


def chat_defaults(settings: Settings, info: EngineInfo) -> tuple[dict[str, Any], dict[str, str]]:
    """What a chat turn on the model of `info` fills in for the settings it leaves out, and where each comes from
    (server, model or built-in): the sampling fields (server flags > its generation config > built-in) and
    max_tokens (the server's, within half its context)."""
    server = settings.sampling_defaults
    values = effective_defaults(server, info.sampling_defaults).given()
    sources = default_sources(server, info.sampling_defaults)
    values["max_tokens"] = chat_max_tokens(settings.default_max_tokens, info.max_model_len)
    sources["max_tokens"] = "server"
    return values, sources


def effective_settings(session: SessionRecord, preset: PresetRecord | None) -> dict[str, Any]:
    """The settings a turn of `session` uses (its model, its sampling): the chat's own, else its preset's (the
    server's defaults fill in the rest later)."""
    merged = {**(preset.settings if preset is not None else {}), **(session.settings or {})}
    return {k: v for k, v in merged.items() if k in CHAT_SETTING_KEYS}


def effective_system_prompt(session: SessionRecord, preset: PresetRecord | None, server_default: str) -> str:
    """The chat's system prompt, else its preset's, else the server's default."""
    return session.system_prompt or (preset.system_prompt if preset is not None else "") or server_default

"""Reading an OpenAI request's input: the model name, chat messages or a completion prompt, as token ids."""

from __future__ import annotations

import json
from typing import Any

from app.routes.context import Services
from app.services.errors import APIError, bad_request

ROLES = ("system", "user", "assistant", "developer")
MAX_CACHE_SALT_CHARS = 1024


def check_model(body: dict[str, Any], svc: Services) -> str:
    """The served model's id; 404 when the request names another model."""
    engine = svc.engine.engine
    served = engine.model_name if engine is not None else svc.settings.model
    model = body.get("model")
    if model is None:
        return served
    if not isinstance(model, str):
        raise bad_request(f"model must be a string, got {json.dumps(model)[:80]}", "model")
    if model != served:
        raise APIError(
            404,
            f"model {model[:200]!r} not found; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )
    return served


def requested_cache_salt(body: dict[str, Any]) -> str | None:
    """vLLM's per-request `cache_salt`: None when absent; 400 unless a non-empty string within the limit."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise bad_request(f"cache_salt must be a non-empty string, got {json.dumps(salt)[:80]}", "cache_salt")
    if len(salt) > MAX_CACHE_SALT_CHARS:
        raise bad_request(
            f"cache_salt is {len(salt)} characters, over the limit of {MAX_CACHE_SALT_CHARS}", "cache_salt"
        )
    return salt


def parse_messages(body: dict[str, Any], max_messages: int, max_chars: int) -> list[dict[str, str]]:
    """`messages` as [{role, content}] with text content; 400 naming the bad message otherwise."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > max_messages:
        raise bad_request(
            f"messages holds {len(messages)} messages, over the limit of {max_messages}", "messages"
        )
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object with role and content", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {json.dumps(role)[:60]}",
                "messages",
            )
        if isinstance(content, list):  # content parts: only text is served
            parts = [
                p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None for p in content
            ]
            if any(not isinstance(p, str) for p in parts):
                raise bad_request(f"messages[{i}].content parts must be text parts", "messages")
            content = "".join(parts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise bad_request(
                f"messages[{i}].content must be a string, got {json.dumps(content)[:60]}", "messages"
            )
        if len(content) > max_chars:
            raise bad_request(
                f"messages[{i}].content is {len(content)} characters, over the limit of {max_chars}",
                "messages",
            )
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat template's rendering with the generation prompt, as token ids."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


async def prompt_ids(svc: Services, kind: str, body: dict[str, Any]) -> tuple[list[int], int]:
    """The prompt of a chat or completion request as token ids (tokenized off the event loop), and how many of its
    leading ids are public (the template's and a published system prompt's: app/services/public_prefix.py)."""
    settings = svc.settings
    if kind == "chat":
        messages = parse_messages(body, settings.max_messages, settings.max_message_chars)
        public = svc.public_prefixes

        def render(tok: Any) -> tuple[list[int], int]:
            ids = render_chat(tok, messages)
            return ids, public.length(messages, ids) if public is not None else 0

        return await svc.engine.tokenize(render)
    return await _completion_ids(svc, body), 0


async def _completion_ids(svc: Services, body: dict[str, Any]) -> list[int]:
    settings = svc.settings
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt is empty", "prompt")
        if len(prompt) > settings.max_message_chars:
            raise bad_request(
                f"prompt is {len(prompt)} characters, over the limit of {settings.max_message_chars}",
                "prompt",
            )
        return await svc.engine.tokenize(lambda tok: list(tok.encode(prompt, add_special_tokens=False)))
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request(
            "prompt: batches of several prompts are not supported; send one prompt per request", "prompt"
        )
    raise bad_request("prompt must be a non-empty string or a list of token ids", "prompt")

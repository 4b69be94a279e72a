"""Reading an OpenAI request's input: the model name, chat messages or a completion prompt, as token ids."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from app.http.errors import bad_request
from app.http.model_registry import ModelHandle
from app.http.services import Services
from app.openai.tool_calls import OPEN
from app.openai.tools import NO_TEMPLATE_SUPPORT, UNPARSED_FORMAT

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_CACHE_SALT_CHARS = 1024


def check_model(body: dict[str, Any], svc: Services) -> str:
    """The id of the served model the request names (unset: the default model); 404 naming the served ones when it
    names another."""
    model = body.get("model")
    if model is None:
        return svc.models.default_name
    if not isinstance(model, str):
        raise bad_request(f"model must be a string, got {json.dumps(model)[:80]}", "model")
    return svc.models.get(model).name


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


def parse_messages(body: dict[str, Any], max_messages: int, max_chars: int) -> list[dict[str, Any]]:
    """`messages` as [{role, content}] with text content, in the shape HF chat templates take: an assistant's
    `tool_calls` with their arguments as objects, a tool result's `tool_call_id`; 400 naming the bad message
    otherwise."""
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
        calls = m.get("tool_calls") if role == "assistant" else None
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
        message: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        if calls is not None:
            message["tool_calls"] = _tool_calls(calls, i)
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(
                    f"messages[{i}].tool_call_id must be the id of the call it answers", "messages"
                )
            message["tool_call_id"] = call_id
        out.append(message)
    return out


def _tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's OpenAI `tool_calls`, with each call's arguments as the object templates expect."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list of calls", "messages")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise bad_request(
                f'{where}[{j}] must be {{"type": "function", "function": {{"name", "arguments"}}}}',
                "messages",
            )
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            raise bad_request(f"{where}[{j}].function.arguments is not valid JSON", "messages") from None
        if not isinstance(arguments, dict):
            raise bad_request(f"{where}[{j}].function.arguments must be a JSON object", "messages")
        entry: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def uses_tools(messages: list[dict[str, Any]]) -> bool:
    """Whether a conversation holds tool calls or tool results."""
    return any(m["role"] == "tool" or "tool_calls" in m for m in messages)


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The chat template's rendering (with `tools`, if any) and the generation prompt, as token ids; 400 when the
    template refuses the conversation (its `raise_exception`, e.g. a tool-call id it does not accept)."""
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
    except TemplateError as exc:
        raise bad_request(f"the model's chat template refused the conversation: {exc}", "messages") from None
    return list(tokenizer.encode(text, add_special_tokens=False))


async def prompt_ids(
    svc: Services,
    model: ModelHandle,
    kind: str,
    body: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], int]:
    """The prompt of a chat or completion request as token ids (tokenized off the event loop), and how many of its
    leading ids are public (the template's and a published system prompt's: app/http/public_prefix.py). A chat
    with `tools`, tool calls or tool results needs a template that renders tools: 400 otherwise."""
    settings = svc.settings
    if kind == "chat":
        messages = parse_messages(body, settings.max_messages, settings.max_message_chars)
        public = model.public_prefixes
        needs_tools = tools is not None or body.get("tools") is not None or uses_tools(messages)

        def render(tok: Any) -> tuple[list[int], int]:
            refusal = tools_refusal(getattr(tok, "chat_template", None)) if needs_tools else None
            if refusal is not None:
                raise bad_request(refusal, "tools" if body.get("tools") is not None else "messages")
            ids = render_chat(tok, messages, tools)
            # tools are rendered into the system turn: the published prefix no longer leads the prompt
            return ids, public.length(messages, ids) if public is not None and tools is None else 0

        return await model.engine.tokenize(render)
    return await _completion_ids(svc, model, body), 0


async def _completion_ids(svc: Services, model: ModelHandle, body: dict[str, Any]) -> list[int]:
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
        return await model.engine.tokenize(lambda tok: list(tok.encode(prompt, add_special_tokens=False)))
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


def tools_refusal(template: str | dict[str, str] | None) -> str | None:
    """Why tools cannot be offered with this chat template, or None: it must render `tools` and write calls in the
    format the tool-call parser reads. A dict of named templates (Hermes, Cohere) uses its `tool_use` one."""
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    if not template or not _references_tools(template):
        return NO_TEMPLATE_SUPPORT
    if OPEN not in template:
        return UNPARSED_FORMAT
    return None


@lru_cache(maxsize=8)
def _references_tools(template: str) -> bool:
    """Whether the template reads a `tools` variable (by its text where it uses a tag only transformers knows, such
    as `{% generation %}`)."""
    from jinja2 import TemplateError, meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return "tools" in meta.find_undeclared_variables(env.parse(template))
    except TemplateError:
        return re.search(r"\btools\b", template) is not None

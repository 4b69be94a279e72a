"""The OpenAI Responses API, its text subset: `POST /v1/responses` is read into a chat completion's body (so it runs
the same path: auth, limits, sampling, the engine) and answered as a `response` object, or as the SSE events OpenAI
sends (`response.created` ... `response.output_text.delta` ... `response.completed`). Anything else it could ask
(tools, images, files, stored responses, reasoning) is a 400 naming the field."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from app.engine_client.request_stream import RequestStream
from app.http.errors import bad_request, from_exception
from engine.core.outputs import RequestOutput
from engine.core.sequence import FinishReason

FIELDS = frozenset(
    {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "user"}
)
# fields whose only served value is the no-op one: what it must be, in words
NO_OP = {
    "store": (lambda v: v is False, "false (this server keeps no responses)"),
    "tools": (lambda v: v == [], "[] (no tools on /v1/responses)"),
    "text": (lambda v: v == {"format": {"type": "text"}}, '{"format": {"type": "text"}}'),
}
INPUT_ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")  # a previous turn's output may come back as input


def chat_body(body: dict[str, Any], max_messages: int, max_chars: int) -> dict[str, Any]:
    """The chat-completions body a Responses request stands for; 400 naming the field it cannot serve."""
    for name, value in body.items():
        if name in FIELDS or value is None:
            continue
        if name in NO_OP:
            served, what = NO_OP[name]
            if not served(value):
                raise bad_request(f"{name} is not supported by this server: it must be {what}", name)
            continue
        raise bad_request(f"unknown field {name[:80]!r}: /v1/responses does not accept it", name[:80])
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"), max_messages)
    for i, message in enumerate(messages):
        if len(message["content"]) > max_chars:
            where = "instructions" if i == 0 and instructions is not None else "input"
            raise bad_request(
                f"{where} holds a message of {len(message['content'])} characters, over the limit of {max_chars}",
                where,
            )
    limit = body.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise bad_request(
            f"max_output_tokens must be a positive integer, got {json.dumps(limit)[:80]}", "max_output_tokens"
        )
    chat: dict[str, Any] = {"messages": messages}
    for name, chat_name in (
        ("model", "model"),
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("user", "user"),
    ):
        if body.get(name) is not None:
            chat[chat_name] = body[name]
    return chat


def _input_messages(value: Any, max_messages: int) -> list[dict[str, Any]]:
    """`input`: a string (one user message) or a list of message items with text content."""
    if isinstance(value, str):
        if not value:
            raise bad_request("input is empty", "input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("input must be a non-empty string or a list of message items", "input")
    if len(value) > max_messages:
        raise bad_request(f"input holds {len(value)} items, over the limit of {max_messages}", "input")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise bad_request(
                f"input[{i}] of type {json.dumps(kind)[:60]} is not supported: only message items "
                "({role, content}) are served",
                "input",
            )
        role = item.get("role")
        if role not in INPUT_ROLES:
            raise bad_request(
                f"input[{i}].role must be one of {', '.join(INPUT_ROLES)}, got {json.dumps(role)[:60]}",
                "input",
            )
        messages.append({"role": role, "content": _text_of(item.get("content"), i)})
    return messages


def _text_of(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"input[{i}].content must be a string or a list of input_text parts", "input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(
                f"input[{i}].content[{j}] of type {json.dumps(kind)[:60]} is not supported: only text parts "
                "(input_text) are served",
                "input",
            )
        texts.append(part["text"])
    return "".join(texts)


@dataclass(frozen=True)
class ResponseCall:
    """What a response object repeats of its request, and its ids."""

    response_id: str
    item_id: str
    model: str
    created_at: int
    body: dict[str, Any]  # the Responses request
    num_prompt_tokens: int

    @classmethod
    def new(cls, response_id: str, model: str, created_at: int, body: dict[str, Any], num_prompt_tokens: int):
        return cls(response_id, "msg_" + uuid.uuid4().hex, model, created_at, body, num_prompt_tokens)

    def message(self, status: str, text: str | None) -> dict[str, Any]:
        """The assistant's output message item (no content yet while `text` is None)."""
        content = [] if text is None else [output_text(text)]
        return {
            "type": "message",
            "id": self.item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def response(self, result: RequestOutput | None) -> dict[str, Any]:
        """The response object: in progress (no output) until `result` is the finished request."""
        status, incomplete = "in_progress", None
        output: list[dict[str, Any]] = []
        usage = None
        if result is not None:
            out = result.outputs[0]
            status = "incomplete" if out.finish_reason is FinishReason.LENGTH else "completed"
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
            output = [self.message(status, out.text)]
            num_output = len(out.token_ids)
            usage = {
                "input_tokens": self.num_prompt_tokens,
                "input_tokens_details": {"cached_tokens": result.num_cached_tokens},
                "output_tokens": num_output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.num_prompt_tokens + num_output,
            }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": self.body.get("instructions"),
            "max_output_tokens": self.body.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": False,
            "temperature": self.body.get("temperature"),
            "top_p": self.body.get("top_p"),
            "tool_choice": "none",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "store": False,
            "usage": usage,
        }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def response_events(call: ResponseCall, stream: RequestStream) -> AsyncIterator[dict[str, str]]:
    """OpenAI's event sequence for one text message; an `error` event, then `response.failed`, when it fails."""
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> dict[str, str]:
        return {"event": kind, "data": json.dumps({"type": kind, "sequence_number": next(numbers), **fields})}

    where = {"item_id": call.item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=call.response(None))
    yield event("response.in_progress", response=call.response(None))
    yield event("response.output_item.added", output_index=0, item=call.message("in_progress", None))
    yield event("response.content_part.added", **where, part=output_text(""))
    last: RequestOutput | None = None
    async with stream:
        try:
            async for output in stream:
                if output.is_progress_report:
                    continue
                last = output
                delta = output.outputs[0].text_delta
                if delta:
                    yield event("response.output_text.delta", **where, delta=delta, logprobs=[])
        except Exception as exc:  # noqa: BLE001 - the client gets an error event, never a cut stream
            error = from_exception(exc).to_dict()["error"]
            yield event(
                "error", code=error.get("code"), message=error.get("message"), param=error.get("param")
            )
            failed = {**call.response(None), "status": "failed", "error": error}
            yield event("response.failed", response=failed)
            return
    if last is None:  # aborted before anything came: the stream was closed
        return
    final = call.response(last)
    item = final["output"][0]
    text = item["content"][0]["text"]
    yield event("response.output_text.done", **where, text=text, logprobs=[])
    yield event("response.content_part.done", **where, part=output_text(text))
    yield event("response.output_item.done", output_index=0, item=item)
    # as vLLM does, and as the SDK's stream helper needs: `completed` ends every stream, the status says incomplete
    yield event("response.completed", response=final)

"""Building OpenAI response bodies from RequestOutputs: choices, chunks, usage and logprobs."""

from __future__ import annotations

import time
from typing import Any

from app.http.messages import usage_json
from app.openai.tool_calls import ToolCall
from engine.core.outputs import CompletionOutput, Logprob, PromptProgress, RequestOutput
from engine.core.sequence import FinishReason


def finish_reason(output: CompletionOutput) -> str | None:
    """The OpenAI finish_reason of one sample ("stop", "length", "abort"), None while it runs."""
    reason = output.finish_reason
    if reason is None or reason is FinishReason.ERROR:
        return None
    return reason.value


def usage(result: RequestOutput, prompt_tokens: int) -> dict[str, Any]:
    """`usage` of a request, over all its samples."""
    completion_tokens = sum(len(o.token_ids) for o in result.outputs)
    return usage_json(
        prompt_tokens,
        completion_tokens,
        result.num_cached_tokens,
        sum(o.num_draft_tokens for o in result.outputs),
        sum(o.num_accepted_tokens for o in result.outputs),
    )


def envelope(kind: str, response_id: str, model: str, created: int | None = None) -> dict[str, Any]:
    """The fields every response or chunk starts with."""
    return {"id": response_id, "object": kind, "created": created or int(time.time()), "model": model}


def chat_logprobs(entries: list[Logprob], token_text: dict[int, str]) -> dict[str, Any]:
    """Chat-style logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text.get(token_id, "")
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries
        ]
    }


def completion_logprobs(
    entries: list[Logprob], token_text: dict[int, str], text_offset: int
) -> dict[str, Any]:
    """Legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, offsets = [], []
    for e in entries:
        tokens.append(token_text.get(e.token_id, ""))
        offsets.append(text_offset)
        text_offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{token_text.get(t, ""): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def token_ids_of(entries: list[Logprob]) -> set[int]:
    """Every token id a logprobs block needs text for."""
    ids = {e.token_id for e in entries}
    for e in entries:
        ids.update(t for t, _ in e.top)
    return ids


class LogprobCursor:
    """Remembers how many logprob entries of each sample were already sent, for streaming."""

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}

    def new_entries(self, output: CompletionOutput) -> list[Logprob]:
        """The entries of this sample not sent yet (the engine's list is cumulative)."""
        entries = output.logprobs or []
        start = self.sent.get(output.index, 0)
        self.sent[output.index] = len(entries)
        return entries[start:]


def tool_message(items: list[str | ToolCall]) -> dict[str, Any]:
    """A chat `message` from a parsed output: its content (None when it is all calls) and its `tool_calls`."""
    content = "".join(i for i in items if isinstance(i, str))
    calls = [i for i in items if isinstance(i, ToolCall)]
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return message


def tool_deltas(items: list[str | ToolCall], num_calls_before: int) -> list[dict[str, Any]]:
    """The streamed deltas of parsed output: content as it comes; each call as two deltas, its index, id and
    function name first, then its arguments. `num_calls_before` is the sample's count of calls already sent."""
    deltas: list[dict[str, Any]] = []
    index = num_calls_before
    for item in items:
        if isinstance(item, str):
            deltas.append({"content": item})
            continue
        head = {
            "index": index,
            "id": item.id,
            "type": "function",
            "function": {"name": item.name, "arguments": ""},
        }
        deltas.append({"tool_calls": [head]})
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": item.arguments}}]})
        index += 1
    return deltas


def prompt_progress(progress: PromptProgress) -> dict[str, Any]:
    """llama.cpp's `prompt_progress`: `processed` of `total` prompt tokens read, `cache` of them from the prefix cache,
    `time_ms` since the request arrived; and, beyond llama.cpp's, the place in the queue while it waits (1: next)."""
    return {
        "total": progress.total,
        "cache": progress.cached,
        "processed": progress.processed,
        "time_ms": progress.time_ms,
        "queue_position": progress.queue_position,
    }

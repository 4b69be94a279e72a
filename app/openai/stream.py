"""The SSE events of a streamed chat or completion (a response's are app/openai/responses.py): chunks of deltas, tool
calls, logprobs, a completion's echo, llama.cpp's prompt progress, the usage chunk, `[DONE]`."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from app.http.errors import from_exception
from app.http.services import Services
from app.http.sse import sse_json
from app.openai import format as fmt
from app.openai import responses as responses_api
from app.openai.call import Call, completion_choice, token_text, usage
from app.openai.tool_calls import ToolCallParser
from engine.core.outputs import PromptProgress, RequestOutput

logger = logging.getLogger(__name__)


async def sse_events(svc: Services, call: Call) -> AsyncIterator[dict[str, str]]:
    if call.response is not None:
        async for event in responses_api.response_events(call.response, call.stream):
            yield event
        return
    kind = "chat.completion.chunk" if call.kind == "chat" else "text_completion"
    created = int(time.time())
    cursor = fmt.LogprobCursor()
    text_len: dict[int, int] = {}
    parsers: dict[int, ToolCallParser | None] = {}
    last: RequestOutput | None = None

    def chunk(choices: list[dict[str, Any]]) -> dict[str, str]:
        body = fmt.envelope(kind, call.response_id, call.model, created)
        body["choices"] = choices
        if call.include_usage:
            body["usage"] = None
        return {"data": sse_json(body)}

    def progress_chunk(progress: PromptProgress) -> dict[str, str]:
        body = fmt.envelope(kind, call.response_id, call.model, created)
        body["choices"] = []
        body["prompt_progress"] = fmt.prompt_progress(progress)
        return {"data": sse_json(body)}

    async with call.stream as stream:
        try:
            first = True
            async for output in stream:
                if output.is_progress_report:
                    yield progress_chunk(output.progress)
                    continue
                last = output
                rows: list[list[dict[str, Any]]] = []  # per sample, its choices in successive chunks
                for out in output.outputs:
                    if not (out.text_delta or out.finished or first):  # the role goes out in the first chunk
                        continue
                    parser = parsers.setdefault(out.index, call.parser())
                    deltas: list[dict[str, Any]]
                    if parser is not None:
                        before = parser.num_calls
                        items = parser.feed(out.text_delta).items
                        if out.finished:
                            items += parser.finish().items
                        deltas = fmt.tool_deltas(items, before)
                        if not (deltas or out.finished or first):
                            continue  # all held back: inside a call, or a tail that may start one
                        deltas = deltas or [{"content": ""}]
                    elif call.kind == "chat":
                        deltas = [{"content": out.text_delta}]
                    else:
                        deltas = [{}]
                    if first and call.kind == "chat":
                        deltas[0] = {"role": "assistant", **deltas[0]}
                    logprobs = None
                    completion: dict[str, Any] = {}
                    if call.scoring is not None:
                        entries = cursor.new_entries(out)
                        completion = await completion_choice(
                            svc,
                            call,
                            output,
                            out.text_delta,
                            entries,
                            out.index not in text_len,
                            text_len.get(out.index, 0),
                        )
                        logprobs = completion["logprobs"]
                    elif call.logprobs:
                        entries = cursor.new_entries(out)
                        text_of = await token_text(call.engine, entries)
                        logprobs = (
                            fmt.chat_logprobs(entries, text_of)
                            if call.kind == "chat"
                            else fmt.completion_logprobs(entries, text_of, text_len.get(out.index, 0))
                        )
                    text_len[out.index] = len(out.text)
                    reason = fmt.finish_reason(out)
                    if reason == "stop" and parser is not None and parser.num_calls:
                        reason = "tool_calls"
                    row = [{"index": out.index, "logprobs": None, "finish_reason": None} for _ in deltas]
                    row[0]["logprobs"] = logprobs
                    row[-1]["finish_reason"] = reason  # a sample's finish reason rides on its last delta
                    for choice, delta in zip(row, deltas, strict=True):
                        if call.kind == "chat":
                            choice["delta"] = delta
                        else:
                            choice.update({k: v for k, v in completion.items() if k != "logprobs"})
                    rows.append(row)
                first = False
                for k in range(max((len(r) for r in rows), default=0)):
                    yield chunk([r[k] for r in rows if len(r) > k])
        except Exception as exc:  # noqa: BLE001 - the client gets an error event, never a cut stream
            error = from_exception(exc)
            if error.code == "internal_error":
                logger.exception("%s failed mid-stream", call.response_id)
            else:
                logger.warning("%s failed mid-stream: %s", call.response_id, error.message)
            yield {"data": json.dumps(error.to_dict())}
            yield {"data": "[DONE]"}
            return
    if last is not None and call.include_usage:
        body = fmt.envelope(kind, call.response_id, call.model, created)
        body["choices"] = []
        body["usage"] = usage(call, last)
        yield {"data": json.dumps(body)}
    yield {"data": "[DONE]"}

"""A validated /v1 request queued in the engine (`Call`), and its whole reply's body: choices, usage, logprobs, and a
completion's echo and prompt logprobs (app/openai/echo.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.engine_client.protocol import EngineClient
from app.engine_client.request_stream import RequestStream
from app.http.services import Services
from app.openai import echo as scoring_fmt
from app.openai import format as fmt
from app.openai.echo import PromptScoring
from app.openai.responses import ResponseCall
from app.openai.tool_calls import ToolCallParser
from app.openai.tools import ToolPlan
from engine.core.outputs import Logprob, RequestOutput


@dataclass
class Call:
    """A validated request, queued in the engine."""

    kind: str  # "chat", "completion" or "response" (a chat answered in the Responses API's shape)
    response_id: str
    model: str
    engine: EngineClient  # the model's: its tokenizer decodes the reply's logprobs
    stream: RequestStream
    streaming: bool
    include_usage: bool
    logprobs: bool
    num_prompt_tokens: int
    tools: ToolPlan | None = None  # a chat whose output is parsed for tool calls
    scoring: PromptScoring | None = None  # a completion's echo and prompt logprobs
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    echo_text: str = ""  # the prompt as echoed (with scoring.echo)
    response: ResponseCall | None = None  # a /v1/responses request

    def parser(self) -> ToolCallParser | None:
        """A fresh tool-call parser for one sample, None when the output is plain content."""
        if self.tools is None or not self.tools.names:
            return None
        return ToolCallParser(self.tools.names, self.tools.strict)


async def token_text(
    engine: EngineClient, entries: list[Logprob], more: set[int] | None = None
) -> dict[int, str]:
    ids = sorted(fmt.token_ids_of(entries) | (more or set()))
    if not ids:
        return {}
    texts = await engine.tokenize(lambda tok: [tok.decode([t]) for t in ids])
    return dict(zip(ids, texts, strict=True))


async def full_body(svc: Services, call: Call, result: RequestOutput) -> dict[str, Any]:
    if call.response is not None:
        return call.response.response(result)
    kind = "chat.completion" if call.kind == "chat" else "text_completion"
    body = fmt.envelope(kind, call.response_id, call.model)
    choices = []
    for out in result.outputs:
        logprobs = None
        if call.logprobs and call.kind == "chat":
            logprobs = fmt.chat_logprobs(
                out.logprobs or [], await token_text(call.engine, out.logprobs or [])
            )
        choice: dict[str, Any] = {
            "index": out.index,
            "logprobs": logprobs,
            "finish_reason": fmt.finish_reason(out),
        }
        parser = call.parser()
        if call.scoring is not None:
            choice.update(await completion_choice(svc, call, result, out.text, out.logprobs, True, 0))
        elif parser is not None:
            items = parser.feed(out.text).items + parser.finish().items
            choice["message"] = fmt.tool_message(items)
            if parser.num_calls and choice["finish_reason"] == "stop":
                choice["finish_reason"] = "tool_calls"
        elif call.kind == "chat":
            choice["message"] = {"role": "assistant", "content": out.text}
        choices.append(choice)
    body["choices"] = choices
    body["usage"] = usage(call, result)
    return body


def usage(call: Call, result: RequestOutput) -> dict[str, Any]:
    """The request's usage; an echo of the prompt alone (max_tokens 0) shows no completion tokens."""
    if call.scoring is not None and call.scoring.echo_only:
        result = dataclasses.replace(
            result, outputs=[dataclasses.replace(o, token_ids=[]) for o in result.outputs]
        )
    return fmt.usage(result, call.num_prompt_tokens)


async def completion_choice(
    svc: Services,
    call: Call,
    result: RequestOutput,
    text: str,
    entries: list[Logprob] | None,
    with_prompt: bool,
    offset: int,
) -> dict[str, Any]:
    """A completion choice's (or chunk's) `text` and `logprobs`, the echoed prompt first `with_prompt`, and vLLM's
    `prompt_logprobs` there when asked (`offset`: the output's text before this chunk, echo excluded)."""
    scoring = call.scoring
    assert scoring is not None
    scores = result.prompt_logprobs
    more = scoring_fmt.scored_prompt_ids(call.prompt_ids, scores) if with_prompt and scores else set()
    wanted = (entries or []) if call.logprobs else None
    text_of = await token_text(call.engine, wanted or [], more) if wanted is not None or more else {}
    text, block = scoring_fmt.completion_text_and_logprobs(
        scoring,
        (call.prompt_ids, scores, call.echo_text),
        text,
        wanted,
        text_of,
        offset + (len(call.echo_text) if scoring.echo else 0),
        with_prompt,
    )
    fields: dict[str, Any] = {"text": text, "logprobs": block}
    if scoring.prompt_logprobs is not None and with_prompt:
        fields["prompt_logprobs"] = scoring_fmt.vllm_prompt_logprobs(
            call.prompt_ids, scores, text_of, scoring.prompt_logprobs
        )
    return fields

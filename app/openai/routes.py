"""OpenAI-compatible API: /v1/chat/completions and /v1/completions, streaming (SSE) or not, and the route table of
/v1 (the models are in models.py); any other /v1 path is a 404 naming the endpoints served."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, Router
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketClose

from app.engine_client.request_label import api_label
from app.engine_client.request_stream import (
    RequestFailed,
    RequestStream,
    RequestTimedOut,
    ServerShuttingDown,
    collect,
)
from app.http.cache_scope import cache_salt
from app.http.credentials import credential_of, revocation, revoked_error
from app.http.error_handlers import error_response
from app.http.errors import APIError, bad_request, from_exception
from app.http.identity import revoked_error as key_revoked
from app.http.key_auth import end_with_key
from app.http.limits import Lease
from app.http.params import read_json_object
from app.http.sampling import get_bool, get_int, resolve_max_tokens, sampling_params
from app.http.security import api_caller
from app.http.services import Services, services
from app.http.shutdown import SHUTDOWN_MESSAGE
from app.http.sse import event_stream, sse_json
from app.openai import echo as scoring_fmt
from app.openai import format as fmt
from app.openai import responses as responses_api
from app.openai.echo import PromptScoring, read_scoring
from app.openai.input import check_model, requested_cache_salt
from app.openai.input import prompt_ids as prompt_input
from app.openai.models import list_models, retrieve_model
from app.openai.request_fields import check_fields
from app.openai.responses import ResponseCall
from app.openai.tool_calls import CLOSE, ToolCallParser
from app.openai.tools import ToolPlan, tool_plan
from engine.core.outputs import Logprob, PromptProgress, RequestOutput

logger = logging.getLogger(__name__)


@dataclass
class _Call:
    """A validated request, queued in the engine."""

    kind: str  # "chat", "completion" or "response" (a chat answered in the Responses API's shape)
    response_id: str
    model: str
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


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions."""
    return await _handle(request, "chat")


async def completions(request: Request) -> Response:
    """POST /v1/completions."""
    return await _handle(request, "completion")


async def responses(request: Request) -> Response:
    """POST /v1/responses (text only: app/openai/responses.py)."""
    return await _handle(request, "response")


async def _handle(request: Request, kind: str) -> Response:
    svc = services(request)
    lease: Lease | None = None
    try:
        owner = api_caller(request, svc.settings)
        lease = svc.admission.admit(request, owner)  # shutting down (503) or over a client limit (429)
        credential = await credential_of(request, svc, owner=owner)  # an account's cookie, a per-user key
        call = await _start(request, svc, kind, owner)
        rid = call.response_id
        end_with_key(  # a revoked key's request ends with an api_key_revoked error
            request,
            svc,
            lambda: svc.engine.is_running(rid),
            lambda: svc.engine.end_request(rid, key_revoked()),
        )
    except Exception as exc:  # noqa: BLE001 - every failure before streaming becomes an API error
        if lease is not None:
            lease.release()
        error = from_exception(exc)
        svc.metrics.observe_error(error.status)
        return error_response(error)
    if call.streaming:
        return event_stream(
            _sse(svc, call, lease),
            svc,
            _shutdown_events,
            on_close=lambda: _close(call, lease),
            revoked=revocation(request, svc, credential, _revoked_events),
        )
    try:
        result = await collect(call.stream, request.receive)
    except (RequestFailed, RequestTimedOut, APIError) as exc:  # APIError: its API key was revoked
        error = from_exception(exc)
        svc.metrics.observe_error(error.status)
        return error_response(error)
    finally:
        lease.release()
    if result is None:  # the client went away; the request was aborted
        return Response(status_code=499)
    return JSONResponse(await _full_body(svc, call, result))


async def _start(request: Request, svc: Services, kind: str, owner: str | None) -> _Call:
    original = body = await read_json_object(request, svc.settings.max_body_bytes)
    if kind == "response":  # read as the chat completion it stands for; answered in its own shape
        body = responses_api.chat_body(body, svc.settings.max_messages, svc.settings.max_message_chars)
    api_kind, kind = kind, "chat" if kind == "response" else kind
    user = check_fields(body, kind)
    model = check_model(body, svc)
    requested_salt = requested_cache_salt(body)
    streaming = get_bool(body, "stream", False)
    # llama.cpp's server convention: a stream sends the prompt's progress before its first token
    progress = get_bool(body, "return_progress", False) and streaming
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request(
            f"stream_options.include_usage must be true or false, got {json.dumps(include_usage)[:80]}",
            "stream_options",
        )
    plan = None
    if kind == "chat":
        plan = tool_plan(body)
        want = get_bool(body, "logprobs", False)
        top = get_int(body, "top_logprobs", None)
        if top is not None and not want:
            raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
        logprobs = (top or 0) if want else None
        requested = get_int(body, "max_completion_tokens", None)
        if requested is None:
            requested = get_int(body, "max_tokens", None)
    else:
        scoring, requested = read_scoring(body)
        logprobs = scoring.logprobs
    prompt_ids, public_prefix_len = await prompt_input(svc, kind, body, plan.render if plan else None)
    max_tokens = resolve_max_tokens(
        requested,
        len(prompt_ids),
        svc.engine.info.max_model_len,
        prompt_param={"response": "input", "chat": "messages"}.get(api_kind, "prompt"),
    )
    params = sampling_params(
        body,
        max_tokens=max_tokens,
        logprobs=logprobs,
        defaults=svc.sampling_defaults.given(),
        forced=plan.forced if plan else None,
        # at most one call, where no grammar forces it: the output ends at the first call's closing marker
        extra_stop=(CLOSE,) if plan and plan.single and plan.names and plan.forced is None else (),
    )
    if progress:
        params = dataclasses.replace(params, report_progress=True)
    echoed = ""
    if kind == "completion":
        params = dataclasses.replace(params, prompt_logprobs=scoring.engine_prompt_logprobs)
        if scoring.echo:
            written = scoring_fmt.echo_text(body)
            echoed = (
                written if written is not None else await svc.engine.tokenize(lambda t: t.decode(prompt_ids))
            )
    prefix = {"chat": "chatcmpl-", "completion": "cmpl-", "response": "resp_"}[api_kind]
    response_id = prefix + uuid.uuid4().hex
    # a request's own salt covers its whole prompt (vLLM's meaning), published system prompt included
    stream = await svc.engine.add_request(
        response_id,
        prompt_ids,
        params,
        cache_salt=cache_salt(request, svc.settings, owner, requested_salt),
        public_prefix_len=0 if requested_salt is not None else public_prefix_len,
        label=api_label(api_kind, owner, user),
    )
    logger.info(
        "%s %s: %d prompt tokens, max_tokens %d, n %d, stream %s, tools %d, user %r",
        kind,
        response_id,
        len(prompt_ids),
        max_tokens,
        params.n,
        streaming,
        len(plan.names) if plan else 0,
        user,
    )
    response = None
    if api_kind == "response":
        response = ResponseCall.new(response_id, model, int(time.time()), original, len(prompt_ids))
    return _Call(
        api_kind,
        response_id,
        model,
        stream,
        streaming,
        bool(include_usage),
        logprobs is not None,
        len(prompt_ids),
        plan,
        scoring if kind == "completion" else None,
        prompt_ids,
        echoed,
        response,
    )


async def _token_text(svc: Services, entries: list[Logprob], more: set[int] | None = None) -> dict[int, str]:
    ids = sorted(fmt.token_ids_of(entries) | (more or set()))
    if not ids:
        return {}
    texts = await svc.engine.tokenize(lambda tok: [tok.decode([t]) for t in ids])
    return dict(zip(ids, texts, strict=True))


async def _full_body(svc: Services, call: _Call, result: RequestOutput) -> dict[str, Any]:
    if call.response is not None:
        return call.response.response(result)
    kind = "chat.completion" if call.kind == "chat" else "text_completion"
    body = fmt.envelope(kind, call.response_id, call.model)
    choices = []
    for out in result.outputs:
        logprobs = None
        if call.logprobs and call.kind == "chat":
            logprobs = fmt.chat_logprobs(out.logprobs or [], await _token_text(svc, out.logprobs or []))
        choice: dict[str, Any] = {
            "index": out.index,
            "logprobs": logprobs,
            "finish_reason": fmt.finish_reason(out),
        }
        parser = call.parser()
        if call.scoring is not None:
            choice.update(await _completion_choice(svc, call, result, out.text, out.logprobs, True, 0))
        elif parser is not None:
            items = parser.feed(out.text).items + parser.finish().items
            choice["message"] = fmt.tool_message(items)
            if parser.num_calls and choice["finish_reason"] == "stop":
                choice["finish_reason"] = "tool_calls"
        elif call.kind == "chat":
            choice["message"] = {"role": "assistant", "content": out.text}
        choices.append(choice)
    body["choices"] = choices
    body["usage"] = _usage(call, result)
    return body


def _usage(call: _Call, result: RequestOutput) -> dict[str, Any]:
    """The request's usage; an echo of the prompt alone (max_tokens 0) shows no completion tokens."""
    if call.scoring is not None and call.scoring.echo_only:
        result = dataclasses.replace(
            result, outputs=[dataclasses.replace(o, token_ids=[]) for o in result.outputs]
        )
    return fmt.usage(result, call.num_prompt_tokens)


async def _completion_choice(
    svc: Services,
    call: _Call,
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
    text_of = await _token_text(svc, wanted or [], more) if wanted is not None or more else {}
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


def _shutdown_events() -> list[dict[str, str]]:
    """How a stream cut by the shutdown ends: an error chunk of type `server_shutdown`, then `[DONE]`."""
    error = from_exception(ServerShuttingDown(SHUTDOWN_MESSAGE))
    return [{"data": json.dumps(error.to_dict())}, {"data": "[DONE]"}]


def _revoked_events() -> list[dict[str, str]]:
    """How a stream ends once the sign-in (or key) it was made with is gone: an error chunk, then `[DONE]`."""
    return [{"data": json.dumps(revoked_error("this stream").to_dict())}, {"data": "[DONE]"}]


def _close(call: _Call, lease: Lease) -> None:
    call.stream.close()  # aborts the request unless it finished
    lease.release()


async def _sse(svc: Services, call: _Call, lease: Lease) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a streamed request, ending with `data: [DONE]`; closing it aborts the request."""
    try:
        async for event in _sse_events(svc, call):
            yield event
    finally:
        lease.release()


async def _sse_events(svc: Services, call: _Call) -> AsyncIterator[dict[str, str]]:
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
                        completion = await _completion_choice(
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
                        text_of = await _token_text(svc, entries)
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
        body["usage"] = _usage(call, last)
        yield {"data": json.dumps(body)}
    yield {"data": "[DONE]"}


PREFIX = "/v1"
# what this server serves under PREFIX; any other path there is a 404 that lists these (not_served)
ENDPOINTS = [
    Route("/models", list_models, methods=["GET"]),
    Route("/models/{model_id:path}", retrieve_model, methods=["GET"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
    Route("/completions", completions, methods=["POST"]),
    Route("/responses", responses, methods=["POST"]),
]


def served_endpoints() -> str:
    """The endpoints under PREFIX, as `GET /v1/models, GET /v1/models/{model_id}, ..., POST /v1/completions`."""
    return ", ".join(
        f"{method} {PREFIX}{route.path_format}"
        for route in ENDPOINTS
        for method in sorted(route.methods or ())
        if method != "HEAD"
    )


async def not_served(scope: Scope, receive: Receive, send: Send) -> None:
    """Any other path under PREFIX (`/v1/embeddings`, `/v1/responses`, ...), whatever its method: a 404 in the
    OpenAI shape that names the endpoints this server does serve."""
    if scope["type"] == "websocket":  # as Starlette's own not-found answers a socket
        await WebSocketClose()(scope, receive, send)
        return
    path = scope["path"][:200]
    error = APIError(
        404, f"this server does not serve {path}; it serves {served_endpoints()}", code="unknown_endpoint"
    )
    await error_response(error)(scope, receive, send)


# a method that a served path does not take is still a 405 (Router answers a partial match before its default)
routes = [Mount(PREFIX, app=Router(routes=ENDPOINTS, default=not_served))]

"""OpenAI-compatible API: /v1/chat/completions, /v1/completions and /v1/responses, streaming (SSE) or not, and the
route table of /v1 (the models are in models.py; reply bodies in call.py, stream events in stream.py and
responses.py); any other /v1 path is a 404 naming the endpoints served."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, Router
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketClose

from app.engine_client.request_label import api_label
from app.engine_client.request_stream import (
    RequestFailed,
    RequestTimedOut,
    ServerShuttingDown,
    collect,
)
from app.http.cache_scope import cache_salt
from app.http.credentials import credential_of, revocation, revoked_error
from app.http.error_handlers import error_response
from app.http.errors import APIError, bad_request, from_exception
from app.http.identity import revoked_error as key_revoked
from app.http.key_auth import API_KEY_ID_STATE, end_with_key
from app.http.limits import Lease
from app.http.params import read_json_object
from app.http.sampling import get_bool, get_int, resolve_max_tokens, sampling_params
from app.http.security import api_caller
from app.http.services import Services, services
from app.http.shutdown import SHUTDOWN_MESSAGE
from app.http.sse import event_stream
from app.openai import echo as scoring_fmt
from app.openai import responses as responses_api
from app.openai.call import Call, full_body
from app.openai.echo import read_scoring
from app.openai.input import check_model, requested_cache_salt
from app.openai.input import prompt_ids as prompt_input
from app.openai.models import list_models, retrieve_model
from app.openai.request_fields import check_fields
from app.openai.responses import ResponseCall
from app.openai.stream import sse_events
from app.openai.tool_calls import CLOSE
from app.openai.tools import tool_plan

logger = logging.getLogger(__name__)


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
            lambda: call.engine.is_running(rid),
            lambda: call.engine.end_request(rid, key_revoked()),
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
    return JSONResponse(await full_body(svc, call, result))


async def _start(request: Request, svc: Services, kind: str, owner: str | None) -> Call:
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
    # the model is loaded first if it is not; the lease keeps it loaded until its engine holds the request
    async with svc.models.lease(model) as served:
        prompt_ids, public_prefix_len = await prompt_input(
            svc, served, kind, body, plan.render if plan else None
        )
        max_tokens = resolve_max_tokens(
            requested,
            len(prompt_ids),
            served.info.max_model_len,
            prompt_param={"response": "input", "chat": "messages"}.get(api_kind, "prompt"),
        )
        params = sampling_params(
            body,
            max_tokens=max_tokens,
            logprobs=logprobs,
            defaults=served.sampling_defaults.given(),
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
                    written
                    if written is not None
                    else await served.engine.tokenize(lambda t: t.decode(prompt_ids))
                )
        prefix = {"chat": "chatcmpl-", "completion": "cmpl-", "response": "resp_"}[api_kind]
        response_id = prefix + uuid.uuid4().hex
        # a request's own salt covers its whole prompt (vLLM's meaning), published system prompt included
        stream = await served.engine.add_request(
            response_id,
            prompt_ids,
            params,
            cache_salt=cache_salt(request, svc.settings, owner, requested_salt),
            public_prefix_len=0 if requested_salt is not None else public_prefix_len,
            label=api_label(api_kind, owner, user, request.scope.get("state", {}).get(API_KEY_ID_STATE)),
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
    return Call(
        api_kind,
        response_id,
        model,
        served.engine,
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


def _shutdown_events() -> list[dict[str, str]]:
    """How a stream cut by the shutdown ends: an error chunk of type `server_shutdown`, then `[DONE]`."""
    error = from_exception(ServerShuttingDown(SHUTDOWN_MESSAGE))
    return [{"data": json.dumps(error.to_dict())}, {"data": "[DONE]"}]


def _revoked_events() -> list[dict[str, str]]:
    """How a stream ends once the sign-in (or key) it was made with is gone: an error chunk, then `[DONE]`."""
    return [{"data": json.dumps(revoked_error("this stream").to_dict())}, {"data": "[DONE]"}]


def _close(call: Call, lease: Lease) -> None:
    call.stream.close()  # aborts the request unless it finished
    lease.release()


async def _sse(svc: Services, call: Call, lease: Lease) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a streamed request, ending with `data: [DONE]`; closing it aborts the request."""
    try:
        async for event in sse_events(svc, call):
            yield event
    finally:
        lease.release()


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

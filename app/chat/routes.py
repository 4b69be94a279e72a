"""Chat sessions over JSON: create, list, read, rename, delete, switch branches; replies streamed over SSE."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.chat.branches import path_json, turn_target
from app.chat.chat_settings import chat_defaults, check_session_settings
from app.chat.reply import SHUTDOWN, Reply
from app.chat.service import ChatService, ReplyMode, chat_of
from app.chat.summary import summarize_into_new_chat
from app.chat.truncation import truncate_value
from app.chat.ws import error_frame
from app.db import MessageStatus, PresetRef, SessionRecord
from app.http.credentials import credential_of, revocation, revoked_error
from app.http.csrf import JSON, check_browser_write
from app.http.error_handlers import error_response
from app.http.errors import bad_request, from_exception, not_found
from app.http.identity import REVOKED
from app.http.key_auth import end_with_key
from app.http.params import read_json_object
from app.http.sampling import get_str
from app.http.security import cookie_authenticated, session_owner
from app.http.services import Services, services
from app.http.sse import Revocation, event_stream, sse_json

logger = logging.getLogger(__name__)
Handler = Callable[[Request, Services, str], Awaitable[Response]]


def _api(handler: Handler, body_type: str = JSON) -> Callable[[Request], Awaitable[Response]]:
    """Resolve the owner, refuse cross-site writes (and a body other than `body_type`), run the handler, and turn
    any failure into an OpenAI-shaped error."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        svc = services(request)
        try:
            owner = session_owner(request, svc.settings)
            # the cookie authenticates it, whichever page sent the request: refuse writes from other sites
            if cookie_authenticated(request, owner):
                check_browser_write(request, svc.settings, body_type)
            return await handler(request, svc, owner)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an API error
            error = from_exception(exc)
            svc.metrics.observe_error(error.status)
            return error_response(error)

    return endpoint


def session_json(s: SessionRecord, chat: ChatService) -> dict[str, Any]:
    """A session as the API shows it."""
    return {
        "id": s.id,
        "title": s.title,
        "system_prompt": s.system_prompt,
        "settings": s.settings,
        "preset_id": s.preset_id,
        "created_at": s.created_at.isoformat(),
        "updated_at": s.updated_at.isoformat(),
        "streaming": chat.is_streaming(s.id),
    }


async def _fields(body: dict[str, Any], svc: Services, owner: str, *, creating: bool) -> dict[str, Any]:
    limit = svc.settings.max_message_chars
    fields: dict[str, Any] = {
        "title": get_str(body, "title", None, max_chars=200),
        "system_prompt": get_str(body, "system_prompt", None, max_chars=limit),
    }
    if body.get("settings") is not None:
        fields["settings"] = check_session_settings(body["settings"], svc.settings.default_max_tokens)
    fields = {k: v for k, v in fields.items() if v is not None}
    if "preset_id" in body:  # null: no preset
        fields["preset_id"] = await preset_of(body, svc, owner)
    elif creating:  # a new chat starts from the owner's default preset, if it has one
        fields["preset_id"] = PresetRef.OWNER_DEFAULT
    return fields


async def preset_of(body: dict[str, Any], svc: Services, owner: str) -> str | None:
    """`preset_id` of a session body: null, or one of the caller's presets (400 naming it otherwise)."""
    preset_id = get_str(body, "preset_id", None, max_chars=64)
    if preset_id is not None and await svc.store.presets.get_preset(owner, preset_id) is None:
        raise bad_request(f"preset_id {preset_id!r} is not one of your presets", "preset_id")
    return preset_id


@_api
async def list_sessions(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/sessions: the caller's sessions, newest first."""
    sessions = await svc.store.chats.list_sessions(owner)
    return JSONResponse({"sessions": [session_json(s, chat_of(svc)) for s in sessions]})


@_api
async def create_session(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions {title?, system_prompt?, settings?, preset_id?}: without preset_id, the caller's default
    preset (if any)."""
    svc.admission.admit_new_identity(request, owner)
    body = await read_json_object(request, svc.settings.max_body_bytes, allow_empty=True)
    session = await svc.store.chats.create_session(owner, **await _fields(body, svc, owner, creating=True))
    return JSONResponse(session_json(session, chat_of(svc)), status_code=201)


@_api
async def get_session(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/sessions/{id}: the session, its active leaf and the branch on show (see `path_json`)."""
    sid = request.path_params["session_id"]
    session = await svc.store.chats.get_session(owner, sid)
    tree = await svc.store.chats.get_tree(owner, sid)
    if session is None or tree is None:
        raise not_found(f"session {sid[:64]!r}")
    return JSONResponse({**session_json(session, chat_of(svc)), **path_json(tree)})


@_api
async def list_messages(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/sessions/{id}/messages: the branch on show."""
    sid = request.path_params["session_id"]
    tree = await svc.store.chats.get_tree(owner, sid)
    if tree is None:
        raise not_found(f"session {sid[:64]!r}")
    return JSONResponse(path_json(tree))


@_api
async def switch_branch(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/branch {message_id}: show the branch through that message (its newest
    continuation); the new branch on show, as GET …/messages returns it."""
    body = await read_json_object(request, svc.settings.max_body_bytes)
    return JSONResponse(await chat_of(svc).switch_branch(owner, request.path_params["session_id"], body))


@_api
async def update_session(request: Request, svc: Services, owner: str) -> Response:
    """PATCH /api/sessions/{id} {title?, system_prompt?, settings?, preset_id?} (preset_id null: none)."""
    sid = request.path_params["session_id"]
    body = await read_json_object(request, svc.settings.max_body_bytes)
    session = await svc.store.chats.update_session(
        owner, sid, **await _fields(body, svc, owner, creating=False)
    )
    if session is None:
        raise not_found(f"session {sid[:64]!r}")
    return JSONResponse(session_json(session, chat_of(svc)))


@_api
async def delete_session(request: Request, svc: Services, owner: str) -> Response:
    """DELETE /api/sessions/{id}: stops its reply if one streams, then deletes it."""
    sid = request.path_params["session_id"]
    if await svc.store.chats.get_session(owner, sid) is None:
        raise not_found(f"session {sid[:64]!r}")
    chat_of(svc).stop(sid)
    await svc.store.chats.delete_session(owner, sid)
    return Response(status_code=204)


@_api
async def stop_reply(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/stop: stop the streaming reply (stored as `stopped`)."""
    sid = request.path_params["session_id"]
    if await svc.store.chats.get_session(owner, sid) is None:
        raise not_found(f"session {sid[:64]!r}")
    return JSONResponse({"stopped": chat_of(svc).stop(sid)})


async def _turn(request: Request, svc: Services, owner: str, mode: ReplyMode) -> Response:
    body = await read_json_object(request, svc.settings.max_body_bytes, allow_empty=True)
    target = turn_target(mode, body)  # a bad id is a 400 before the client's slot is taken
    truncate = truncate_value(body)
    credential = await credential_of(request, svc, owner=owner)
    lease = svc.admission.admit(request, owner)
    reply = await chat_of(svc).start(
        mode,
        owner,
        request.path_params["session_id"],
        body.get("content"),
        lease,
        target=target,
        truncate=truncate,
        attachments=body.get("attachments"),
    )
    end_with_key(  # a revoked key's reply stops, stored as interrupted
        request,
        svc,
        lambda: reply.task is not None and not reply.task.done(),
        lambda: chat_of(svc).stop_reply(reply, MessageStatus.INTERRUPTED, reason=REVOKED),
    )
    return _sse(svc, reply, revocation(request, svc, credential, _revoked_events))


@_api
async def plan_message(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/plan {content?, parent_id?}: what sending it would need, nothing stored or generated:
    {prompt_tokens, max_tokens, max_model_len, fits, truncated_turns, pinned_turns_dropped, options, advice}
    (app/chat/truncation.py); without content, the history alone (what another model would read again)."""
    body = await read_json_object(request, svc.settings.max_body_bytes)
    return JSONResponse(await chat_of(svc).plan(owner, request.path_params["session_id"], body))


@_api
async def list_models(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/models: the models the chat's picker offers, each with its state (loaded, loading, not_loaded,
    failed), the default one named."""
    del owner
    rows = []
    for model in svc.models.models():
        row: dict[str, Any] = {"id": model.name, "state": model.state, "default": model.pinned}
        if model.loading_seconds is not None:
            row["loading_seconds"] = model.loading_seconds
        # loaded once: what a turn on it fills in (the settings form shows it)
        if model.last_info is not None:
            values, sources = chat_defaults(svc.settings, model.last_info)
            row["chat_defaults"], row["chat_default_sources"] = values, sources
        rows.append(row)
    return JSONResponse({"models": rows, "default": svc.models.default_name})


@_api
async def summarize(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/summarize {}: the model summarizes the branch on show (what fits) into a new chat
    that starts from it (its system prompt); 201 {session, summary, truncated_turns}. The old chat is unchanged."""
    await read_json_object(request, svc.settings.max_body_bytes, allow_empty=True)
    lease = svc.admission.admit(request, owner)
    made = await summarize_into_new_chat(chat_of(svc), owner, request.path_params["session_id"], lease)
    body = {
        "session": session_json(made.session, chat_of(svc)),
        "summary": made.text,
        "truncated_turns": made.truncated_turns,
    }
    return JSONResponse(body, status_code=201)


@_api
async def post_message(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/messages {content, parent_id?, truncate?, attachments?}: store it after `parent_id`
    (default: the active leaf; null: a new first message) with the unsent attachments named, and stream the reply
    over SSE. A history that does not fit is cut only as `truncate` ("oldest" | "keep_pinned") says; without it 409
    `context_full`, nothing stored."""
    return await _turn(request, svc, owner, ReplyMode.SEND)


@_api
async def regenerate(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/regenerate {message_id?}: a new version of that reply (default: the active leaf's),
    beside the others, over SSE."""
    return await _turn(request, svc, owner, ReplyMode.REGENERATE)


@_api
async def edit_message(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/edit {content, message_id?, attachments?}: a new version of that user message
    (default: the last one on show; its attachments carry over, plus any unsent ones named), a branch beside the
    old one, and its reply over SSE."""
    return await _turn(request, svc, owner, ReplyMode.EDIT)


@_api
async def continue_reply(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/continue {message_id?}: extend a reply that stopped at its token limit (default: the
    active leaf); its row grows, the new text streams over SSE."""
    return await _turn(request, svc, owner, ReplyMode.CONTINUE)


def _sse(svc: Services, reply: Reply, revoked: Revocation | None) -> Response:
    async def events() -> AsyncIterator[dict[str, str]]:
        async for event in reply.iter_events():
            yield {"event": event["type"], "data": sse_json(event)}

    def on_close() -> None:
        # However the response ends, abort the reply if it still runs: the client went away (even before the first
        # event) or its sign-in ended, stored as interrupted, as when a WebSocket drops (a shutdown has cut it
        # already, as interrupted).
        chat_of(svc).stop_reply(reply, status=MessageStatus.INTERRUPTED)

    return event_stream(events(), svc, _shutdown_events, on_close=on_close, revoked=revoked)


def _revoked_events() -> list[dict[str, str]]:
    """The last event of a reply stream whose sign-in ended (the reply is stored as interrupted): an error, as the
    chat socket's frame."""
    return [{"event": "error", "data": sse_json(error_frame(revoked_error("this reply")))}]


def _shutdown_events() -> list[dict[str, str]]:
    """The last event of a reply stream whose reply did not end in time at shutdown (it is stored once it does)."""
    done = {"type": "done", "reason": SHUTDOWN, "message": None, "usage": None, "timings": {}}
    return [{"event": "done", "data": sse_json(done)}]


routes = [
    Route("/api/models", list_models, methods=["GET"]),
    Route("/api/sessions", list_sessions, methods=["GET"]),
    Route("/api/sessions", create_session, methods=["POST"]),
    Route("/api/sessions/{session_id}", get_session, methods=["GET"]),
    Route("/api/sessions/{session_id}", update_session, methods=["PATCH"]),
    Route("/api/sessions/{session_id}", delete_session, methods=["DELETE"]),
    Route("/api/sessions/{session_id}/messages", list_messages, methods=["GET"]),
    Route("/api/sessions/{session_id}/messages", post_message, methods=["POST"]),
    Route("/api/sessions/{session_id}/plan", plan_message, methods=["POST"]),
    Route("/api/sessions/{session_id}/summarize", summarize, methods=["POST"]),
    Route("/api/sessions/{session_id}/regenerate", regenerate, methods=["POST"]),
    Route("/api/sessions/{session_id}/edit", edit_message, methods=["POST"]),
    Route("/api/sessions/{session_id}/continue", continue_reply, methods=["POST"]),
    Route("/api/sessions/{session_id}/branch", switch_branch, methods=["POST"]),
    Route("/api/sessions/{session_id}/stop", stop_reply, methods=["POST"]),
]

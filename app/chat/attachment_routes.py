"""Files attached to a chat over JSON: upload one (it waits for the next message), list the waiting ones, read one's
text, remove a waiting one. A message sent with `attachments: [ids]` carries them (app/chat/service.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.chat.chat_settings import MODEL_KEY, effective_settings
from app.chat.documents import document_block
from app.chat.routes import _api
from app.chat.service import chat_of
from app.http.csrf import OCTET_STREAM
from app.http.errors import APIError, bad_request, not_found
from app.http.messages import attachment_json
from app.http.params import read_body
from app.http.services import Services


def _attachment_id(request: Request) -> int:
    raw = request.path_params["attachment_id"]
    if not raw.isdecimal() or not 0 < int(raw) < 2**63:
        raise not_found(f"attachment {raw[:40]!r}")
    return int(raw)


async def _upload(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/sessions/{id}/attachments?filename=NAME, the file's bytes as the body (Content-Type:
    application/octet-stream): its text extracted and counted in tokens; 201 {id, message_id: null, filename,
    media_type, bytes, tokens, created_at}."""
    sid = request.path_params["session_id"]
    chat = chat_of(svc)
    filename = request.query_params.get("filename")
    session = await svc.store.chats.get_session(owner, sid)
    if session is None:
        raise not_found(f"session {sid[:64]!r}")
    preset = await svc.store.presets.get_preset(owner, session.preset_id) if session.preset_id else None
    # counted by the chat's model where it is loaded (else by the default model's tokenizer: close, not exact)
    model = chat.loaded_model(effective_settings(session, preset).get(MODEL_KEY))
    limit = svc.settings.max_attachment_bytes
    try:
        data = await read_body(request, limit)
    except APIError as exc:
        if exc.status != 413:
            raise
        raise APIError(
            413,
            f"the file is over the limit of {limit} bytes (max_attachment_bytes)",
            code="request_too_large",
        ) from None
    extracted = await chat.attachments.read(filename or "", data)
    block = document_block(extracted.filename, extracted.text)
    num_tokens = await model.engine.tokenize(lambda tok: len(tok.encode(block, add_special_tokens=False)))
    max_model_len = model.engine.info.max_model_len
    if num_tokens >= max_model_len:
        raise APIError(
            413,
            f"{extracted.filename!r} is {num_tokens} tokens, more than this server's context (max_model_len "
            f"{max_model_len} tokens): attach a shorter file or a part of it, or start the server with a larger "
            "--max-model-len",
            code="request_too_large",
        )
    try:
        record = await svc.store.chats.add_attachment(
            owner,
            sid,
            filename=extracted.filename,
            media_type=extracted.media_type,
            num_bytes=extracted.num_bytes,
            text=extracted.text,
            num_tokens=num_tokens,
            max_unsent=svc.settings.max_attachments_per_message,
        )
    except ValueError as exc:
        raise bad_request(str(exc), "attachments") from None
    if record is None:
        raise not_found(f"session {sid[:64]!r}")
    return JSONResponse(attachment_json(record), status_code=201)


upload = _api(_upload, body_type=OCTET_STREAM)


@_api
async def list_waiting(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/sessions/{id}/attachments: the files waiting for the next message."""
    sid = request.path_params["session_id"]
    records = await svc.store.chats.list_unsent_attachments(owner, sid)
    if records is None:
        raise not_found(f"session {sid[:64]!r}")
    return JSONResponse({"attachments": [attachment_json(a) for a in records]})


@_api
async def get_one(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/sessions/{id}/attachments/{attachment_id}: the file's fields and its `text`."""
    sid = request.path_params["session_id"]
    attachment_id = _attachment_id(request)
    record = await svc.store.chats.get_attachment(owner, sid, attachment_id)
    if record is None:
        raise not_found(f"attachment {attachment_id}")
    return JSONResponse({**attachment_json(record), "text": record.text})


@_api
async def remove(request: Request, svc: Services, owner: str) -> Response:
    """DELETE /api/sessions/{id}/attachments/{attachment_id}: remove a file not sent yet (409 once sent: it is part
    of its message's prompt)."""
    sid = request.path_params["session_id"]
    attachment_id = _attachment_id(request)
    try:
        removed = await svc.store.chats.delete_attachment(owner, sid, attachment_id)
    except ValueError as exc:
        raise APIError(409, str(exc), code="attachment_sent") from None
    if not removed:
        raise not_found(f"attachment {attachment_id}")
    return Response(status_code=204)


routes = [
    Route("/api/sessions/{session_id}/attachments", upload, methods=["POST"]),
    Route("/api/sessions/{session_id}/attachments", list_waiting, methods=["GET"]),
    Route("/api/sessions/{session_id}/attachments/{attachment_id}", get_one, methods=["GET"]),
    Route("/api/sessions/{session_id}/attachments/{attachment_id}", remove, methods=["DELETE"]),
]

"""GET /api/sessions/{id}/export: a chat as a JSON or Markdown file (its owner only)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.chat.export import export_filename, export_json, export_markdown
from app.chat.routes import _api
from app.http.errors import bad_request, not_found
from app.http.services import Services

MEDIA_TYPES = {"json": "application/json", "md": "text/markdown; charset=utf-8"}
FLAG_VALUES = {"1": True, "true": True, "0": False, "false": False}


@_api
async def export_session(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/sessions/{id}/export?format=json|md[&token_ids=true]: an attachment named after the title; JSON holds
    every branch of the chat, Markdown the branch on show."""
    sid = request.path_params["session_id"]
    params = request.query_params
    file_format = params.get("format", "json")
    if file_format not in MEDIA_TYPES:
        raise bad_request(
            f"format must be one of {', '.join(MEDIA_TYPES)}, got {file_format[:40]!r}", "format"
        )
    raw_flag = params.get("token_ids", "false")
    if raw_flag.lower() not in FLAG_VALUES:
        raise bad_request(f"token_ids must be true or false, got {raw_flag[:40]!r}", "token_ids")
    token_ids = FLAG_VALUES[raw_flag.lower()]
    if token_ids and file_format != "json":
        raise bad_request("token_ids are exported in the JSON format only (format=json)", "token_ids")
    session = await svc.store.chats.get_session(owner, sid)
    tree = await svc.store.chats.get_tree(owner, sid)
    if session is None or tree is None:
        raise not_found(f"session {sid[:64]!r}")
    prompt_changes = await svc.store.chats.prompt_changes(owner, sid) or []
    now = datetime.now(timezone.utc)
    if file_format == "json":  # the whole tree: every branch
        document = export_json(
            session,
            list(tree.messages),
            exported_at=now,
            active_leaf_id=tree.leaf_id,
            token_ids=token_ids,
            prompt_changes=prompt_changes,
        )
        body = json.dumps(document, ensure_ascii=False, indent=2) + "\n"
    else:  # for reading: the branch on show
        preset = await svc.store.presets.get_preset(owner, session.preset_id) if session.preset_id else None
        body = export_markdown(
            session,
            list(tree.active_path()),
            exported_at=now,
            preset_name=preset.name if preset is not None else None,
            prompt_changes=prompt_changes,
        )
    ascii_name, unicode_name = export_filename(session.title, file_format)
    disposition = f'attachment; filename="{ascii_name}"'
    if unicode_name != ascii_name:  # RFC 6266: browsers prefer filename*, older clients read filename
        disposition += f"; filename*=UTF-8''{quote(unicode_name, safe='')}"
    return Response(body, media_type=MEDIA_TYPES[file_format], headers={"Content-Disposition": disposition})


routes = [Route("/api/sessions/{session_id}/export", export_session, methods=["GET"])]

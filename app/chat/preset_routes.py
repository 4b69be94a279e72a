"""Presets over JSON: list, create, read, update, delete the caller's named system prompts and sampling settings.

A preset belongs to whoever sessions belong to (the browser cookie, the API key, or the signed-in account): another
caller sees none of them. Its settings follow the rules of a chat's settings (app/chat/chat_settings.py); a chat
follows one preset (its `preset_id`), whose values fill in what the chat leaves unset; new chats follow the caller's
default preset.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.chat.chat_settings import check_session_settings
from app.chat.routes import (
    _api as owner_api,  # the sessions API's wrapper: owner, cross-site check, errors
)
from app.db import PresetRecord
from app.db.presets import MAX_NAME_CHARS
from app.http.errors import bad_request, not_found
from app.http.params import read_json_object
from app.http.sampling import get_bool, get_str
from app.http.services import Services

FIELDS = ("name", "system_prompt", "settings", "is_default")


def preset_json(p: PresetRecord) -> dict[str, Any]:
    """A preset as the API shows it."""
    return {
        "id": p.id,
        "name": p.name,
        "system_prompt": p.system_prompt,
        "settings": p.settings,
        "is_default": p.is_default,
        "created_at": p.created_at.isoformat(),
        "updated_at": p.updated_at.isoformat(),
    }


def _fields(body: dict[str, Any], svc: Services) -> dict[str, Any]:
    """The preset fields of a body, each checked (a 400 naming the first bad one)."""
    unknown = sorted(k for k in body if k not in FIELDS)
    if unknown:
        raise bad_request(
            f"{unknown[0][:60]} is not a preset field; known: {', '.join(FIELDS)}", unknown[0][:60]
        )
    name = get_str(body, "name", None, max_chars=MAX_NAME_CHARS)
    if name is not None:
        name = name.strip()
        if not name:
            raise bad_request("name must not be empty", "name")
    fields: dict[str, Any] = {
        "name": name,
        "system_prompt": get_str(body, "system_prompt", None, max_chars=svc.settings.max_message_chars),
        "is_default": None if body.get("is_default") is None else get_bool(body, "is_default", False),
    }
    if body.get("settings") is not None:
        fields["settings"] = check_session_settings(body["settings"], svc.settings.default_max_tokens)
    return {k: v for k, v in fields.items() if v is not None}


@owner_api
async def list_presets(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/presets: the caller's presets by name, and which one new chats start from."""
    presets = await svc.store.presets.list_presets(owner)
    default_id = next((p.id for p in presets if p.is_default), None)
    return JSONResponse({"presets": [preset_json(p) for p in presets], "default_preset_id": default_id})


@owner_api
async def create_preset(request: Request, svc: Services, owner: str) -> Response:
    """POST /api/presets {name, system_prompt?, settings?, is_default?}: 409 when the name is taken."""
    svc.admission.admit_new_identity(request, owner)
    body = await read_json_object(request, svc.settings.max_body_bytes)
    fields = _fields(body, svc)
    if "name" not in fields:
        raise bad_request("name is required: a preset needs a name", "name")
    preset = await svc.store.presets.create_preset(owner, fields.pop("name"), **fields)
    return JSONResponse(preset_json(preset), status_code=201)


@owner_api
async def get_preset(request: Request, svc: Services, owner: str) -> Response:
    """GET /api/presets/{id}."""
    preset_id = request.path_params["preset_id"]
    preset = await svc.store.presets.get_preset(owner, preset_id)
    if preset is None:
        raise not_found(f"preset {preset_id[:64]!r}")
    return JSONResponse(preset_json(preset))


@owner_api
async def update_preset(request: Request, svc: Services, owner: str) -> Response:
    """PATCH /api/presets/{id} {name?, system_prompt?, settings?, is_default?}: settings are replaced whole."""
    preset_id = request.path_params["preset_id"]
    body = await read_json_object(request, svc.settings.max_body_bytes)
    preset = await svc.store.presets.update_preset(owner, preset_id, **_fields(body, svc))
    if preset is None:
        raise not_found(f"preset {preset_id[:64]!r}")
    return JSONResponse(preset_json(preset))


@owner_api
async def delete_preset(request: Request, svc: Services, owner: str) -> Response:
    """DELETE /api/presets/{id}: the chats that followed it keep their own settings and follow none."""
    preset_id = request.path_params["preset_id"]
    if not await svc.store.presets.delete_preset(owner, preset_id):
        raise not_found(f"preset {preset_id[:64]!r}")
    return Response(status_code=204)


routes = [
    Route("/api/presets", list_presets, methods=["GET"]),
    Route("/api/presets", create_preset, methods=["POST"]),
    Route("/api/presets/{preset_id}", get_preset, methods=["GET"]),
    Route("/api/presets/{preset_id}", update_preset, methods=["PATCH"]),
    Route("/api/presets/{preset_id}", delete_preset, methods=["DELETE"]),
]

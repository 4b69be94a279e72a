"""/api/admin/models: every served model with its state and memory, and the admin's load and unload."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.http.admin_auth import check_admin
from app.http.csrf import check_browser_write
from app.http.error_handlers import error_response
from app.http.errors import APIError, bad_request, from_exception
from app.http.model_registry import ServedModel
from app.http.security import bearer_token
from app.http.services import Services, services


def model_row(svc: Services, model: ServedModel) -> dict[str, Any]:
    """One model for the admin page: id, source, state, what it holds (or would), its pool, running requests."""
    row: dict[str, Any] = {
        "id": model.name,
        "source": model.entry.source,
        "state": model.state,
        "default": model.pinned,
        "memory_bytes": svc.models.need_bytes(model),
        "error": model.error_detail,
    }
    if model.loading_seconds is not None:
        row["loading_seconds"] = model.loading_seconds
    info = model.last_info
    if info is not None:  # each engine's pool; with --replicas every replica has one (as memory_bytes counts)
        row["num_blocks"] = info.num_blocks
        row["kv_pool_bytes"] = svc.settings.replicas * info.num_blocks * info.kv_block_bytes
        row["max_model_len"] = info.max_model_len
    row["running"] = model.handle.engine.num_in_flight if model.handle is not None else 0
    health = model.handle.engine.health() if model.handle is not None else None
    if health is not None:  # --replicas: its own replica set (name, pid, state, in_flight of each)
        row["replicas"] = health["replicas"]
    return row


def models_state(svc: Services) -> dict[str, Any]:
    registry = svc.models
    return {
        "models": [model_row(svc, m) for m in registry.models()],
        "budget_bytes": registry.budget_bytes,
        "held_bytes": registry.held_bytes,
        "models_max": svc.settings.models_max,
        "keep_alive_s": svc.settings.keep_alive_s,
    }


async def list_models(request: Request) -> Response:
    """GET /api/admin/models."""
    svc = services(request)
    try:
        await check_admin(request, svc)
    except Exception as exc:  # noqa: BLE001 - auth failures in the API's error shape
        return error_response(from_exception(exc))
    return JSONResponse(models_state(svc))


async def change_model(request: Request) -> Response:
    """POST /api/admin/models/{model_id}/load or /unload: the model's row once done (a load waits for it)."""
    svc = services(request)
    try:
        await check_admin(request, svc)
        if request.headers.get("x-admin-token") is None and bearer_token(request) is None:
            # the cookie (or loopback) authenticates it: it must come from this server's own pages
            check_browser_write(request, svc.settings)
        name, action = request.path_params["model_id"], request.path_params["action"]
        if action == "load":
            await svc.models.load(name)
        elif action == "unload":
            try:
                await svc.models.unload(name)
            except ValueError as exc:
                raise bad_request(str(exc), "model") from None
        else:
            raise APIError(404, f"no such action {action!r}: load or unload", code="not_found")
    except Exception as exc:  # noqa: BLE001 - auth, refusals and failed loads become API errors
        return error_response(from_exception(exc))
    return JSONResponse(model_row(svc, svc.models.get(name)))


routes = [
    Route("/api/admin/models", list_models, methods=["GET"]),
    Route("/api/admin/models/{model_id:path}/{action}", change_model, methods=["POST"]),
]

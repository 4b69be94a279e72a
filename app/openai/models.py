"""GET /v1/models and GET /v1/models/{model_id}: the models this server serves, each with its state."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.http.model_catalog import weights_written_at
from app.http.model_registry import LOADED, LOADING, ServedModel
from app.http.security import api_caller
from app.http.services import Services, services


def model_object(svc: Services, model: ServedModel) -> dict[str, Any]:
    """A served model as the API shows it: OpenAI's model object, its state (loaded, loading, not_loaded, failed),
    and, once it has loaded, what a request may ask of it."""
    body: dict[str, Any] = {
        "id": model.name,
        "object": "model",
        # when its weights were written; a hub id not fetched yet: when this server started
        "created": weights_written_at(model.entry.source) or svc.models.started_at,
        "owned_by": "pagedchat",
        "state": model.state,
        "default": model.pinned,
    }
    if model.loading_seconds is not None:
        body["loading_seconds"] = model.loading_seconds
    if model.error is not None and model.state != LOADED:
        body["error"] = model.error
    if model.last_info is not None:
        body["max_model_len"] = model.last_info.max_model_len
    if model.handle is not None:
        # what a request that leaves these out samples with (server flags > generation config > built-in)
        body["sampling_defaults"] = model.handle.sampling_defaults.given()
        body["sampling_defaults_source"] = model.handle.sampling_sources
    if model.state in (LOADED, LOADING) or model.held_bytes:
        body["memory_bytes"] = svc.models.need_bytes(model)
    return body


async def list_models(request: Request) -> Response:
    """GET /v1/models: every served model, the default first."""
    svc = services(request)
    api_caller(request, svc.settings)
    return JSONResponse({"object": "list", "data": [model_object(svc, m) for m in svc.models.models()]})


async def retrieve_model(request: Request) -> Response:
    """GET /v1/models/{model_id}: one served model's object; any other id is a 404 naming the served ones."""
    svc = services(request)
    api_caller(request, svc.settings)
    model_id = request.path_params["model_id"]  # a path: hub ids hold a slash
    return JSONResponse(model_object(svc, svc.models.get(model_id)))

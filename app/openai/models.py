"""GET /v1/models and GET /v1/models/{model_id}: the one model this server serves."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.http.security import api_caller
from app.http.services import Services, services
from app.openai.input import model_not_found


def model_object(svc: Services) -> dict[str, Any]:
    """The served model as the API shows it: OpenAI's model object and what a request may ask of it."""
    info = svc.engine.info
    return {
        "id": info.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "pagedchat",
        "max_model_len": info.max_model_len,
        # what a request that leaves these out samples with (server flags > generation config > built-in)
        "sampling_defaults": svc.sampling_defaults.given(),
        "sampling_defaults_source": svc.sampling_sources,
    }


async def list_models(request: Request) -> Response:
    """GET /v1/models: a list of the one model this server serves."""
    svc = services(request)
    api_caller(request, svc.settings)
    return JSONResponse({"object": "list", "data": [model_object(svc)]})


async def retrieve_model(request: Request) -> Response:
    """GET /v1/models/{model_id}: the served model's object; any other id is a 404 naming the served one."""
    svc = services(request)
    api_caller(request, svc.settings)
    model_id = request.path_params["model_id"]  # a path: hub ids hold a slash
    if model_id != svc.engine.info.model_name:
        raise model_not_found(model_id, svc.engine.info.model_name)
    return JSONResponse(model_object(svc))

"""API errors as HTTP responses: the OpenAI error body with its status, and the app's exception handlers."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.http.errors import APIError, from_exception

logger = logging.getLogger(__name__)


def error_response(error: APIError) -> JSONResponse:
    """The JSON response of an API error."""
    return JSONResponse(error.to_dict(), status_code=error.status, headers=error.headers)


async def api_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette exception handler for APIError."""
    assert isinstance(exc, APIError)
    return error_response(exc)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    message = {
        404: f"no route for {request.method} {request.url.path}",
        405: f"method {request.method} not allowed on {request.url.path}",
    }.get(exc.status_code, exc.detail)
    return error_response(APIError(exc.status_code, message, headers=dict(exc.headers or {})))


async def unhandled_error_handler(request: Request, exc: Exception) -> Response:
    """Last resort: log with the request id, answer 500 in the OpenAI shape (or 503 for known outages)."""
    error = from_exception(exc)
    if error.status >= 500 and error.code == "internal_error":
        logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(error)

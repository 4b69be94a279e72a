"""Errors as the OpenAI API shapes them: {"error": {"message", "type", "param", "code"}} with the right status."""

from __future__ import annotations

from typing import Any

from app.db import PresetNameTaken, QuotaExceeded, StoreUnavailable
from app.engine_client.protocol import EngineOverloaded, EngineUnavailable
from app.engine_client.request_stream import RequestFailed, RequestTimedOut, ServerShuttingDown

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
    507: "insufficient_storage_error",
}


class APIError(Exception):
    """An error a client should see: status, a message naming the problem, and optionally the offending param."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.extra = extra or {}  # more fields of the error body (a refused chat send's `context`)
        self.error_type = error_type  # the body's `type`; None: derived from the status
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type
                or _TYPE_BY_STATUS.get(
                    self.status, "server_error" if self.status >= 500 else "invalid_request_error"
                ),
                "param": self.param,
                "code": self.code,
                **self.extra,
            }
        }


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400 naming the offending parameter."""
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def not_found(what: str) -> APIError:
    """A 404 that says what was not found."""
    return APIError(404, f"{what} not found", code="not_found")


def from_exception(exc: BaseException) -> APIError:
    """Map the service's own exceptions (engine bridge, store, bad input) to API errors."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):
        return bad_request(str(exc), _param_of(str(exc)))
    if isinstance(exc, EngineOverloaded):
        return APIError(503, str(exc), code="overloaded", headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, EngineUnavailable):
        return APIError(503, str(exc), code="engine_unavailable", headers={"Retry-After": "5"})
    if isinstance(exc, PresetNameTaken):
        return APIError(409, str(exc), param="name", code="name_taken")
    if isinstance(exc, QuotaExceeded):
        if exc.database:
            return APIError(507, str(exc), code="database_full")
        return APIError(403, str(exc), code="quota_exceeded")
    if isinstance(exc, StoreUnavailable):
        return APIError(
            503,
            f"the database is unavailable: {exc}",
            code="database_unavailable",
            headers={"Retry-After": "2"},
        )
    if isinstance(exc, RequestTimedOut):
        return APIError(504, str(exc), code="timeout")
    if isinstance(exc, ServerShuttingDown):
        return APIError(
            503, str(exc), code="server_shutdown", error_type="server_shutdown", headers={"Retry-After": "5"}
        )
    if isinstance(exc, RequestFailed):
        return APIError(500, str(exc), code="request_failed")
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


_KNOWN_PARAMS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "top_logprobs",
    "stop_token_ids",
)


def _param_of(message: str) -> str | None:
    """The sampling parameter a SamplingParams/engine ValueError message starts with, if any."""
    head = message.split(" ", 1)[0]
    if head in _KNOWN_PARAMS:
        return head
    return None

"""Reading request input: size-limited JSON objects whose strings are all valid Unicode, and integer query
parameters whose errors name the parameter and its range."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from app.http.errors import APIError, bad_request

# ASCII digits only: str.isdigit() and int() also take "²" and "٣", and int() takes " 7" and "1_0"
DECIMAL = re.compile(r"[0-9]{1,18}")
MAX_SHOWN_CHARS = 40


def query_int(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """Query parameter `name` as an integer in [low, high] (`default` when absent); a 400 naming it otherwise."""
    raw = params.get(name)
    if raw is None:
        return default
    if not DECIMAL.fullmatch(raw) or not low <= int(raw) <= high:
        raise bad_request(
            f"{name} must be an integer from {low} to {high}, got {raw[:MAX_SHOWN_CHARS]!r}", name
        )
    return int(raw)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body; 413 past `max_bytes` counting the bytes actually received (a declared length past it is
    refused before a byte is read)."""
    declared = request.headers.get("content-length")
    if declared is not None and DECIMAL.fullmatch(declared) and int(declared) > max_bytes:
        raise APIError(
            413,
            f"request body of {int(declared)} bytes exceeds the limit of {max_bytes} bytes",
            code="request_too_large",
        )
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > max_bytes:
            raise APIError(
                413, f"request body exceeds the limit of {max_bytes} bytes", code="request_too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request, max_bytes: int, *, allow_empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object; 413 past `max_bytes` counting the bytes actually received, 400 if not JSON."""
    body = await read_body(request, max_bytes)
    if not body and allow_empty:
        return {}
    if not body:
        raise bad_request("the request body is empty: expected a JSON object")
    try:
        value = json.loads(body)
    except UnicodeDecodeError:
        raise bad_request("the request body is not valid UTF-8") from None
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    if not isinstance(value, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(value).__name__}")
    check_unicode(value, "body")
    return value


def check_unicode(value: Any, where: str) -> None:
    """400 naming the field when a string holds a lone surrogate (JSON allows "\\ud800"; UTF-8 cannot hold it)."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_str(item, path)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_str(key, path)
                stack.append((child, key if path == where else f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))


def _check_str(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        field = path.split(".", 1)[0].split("[", 1)[0]
        raise bad_request(
            f"{path[:200]} is not valid Unicode: it holds a lone surrogate (a \\ud800-\\udfff escape)", field
        ) from None

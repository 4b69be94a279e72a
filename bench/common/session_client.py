"""An async client of pagedchat's session API: create a session, read a reply's SSE events, time a turn."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx


@dataclass
class TurnResult:
    """One conversation turn as the client saw it (times in seconds from the send)."""

    ok: bool
    ttft_s: float = float("nan")
    e2e_s: float = float("nan")
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    server_ttft_s: float = float("nan")
    text: str = ""
    error: str = ""

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the server had to compute (not served from the prefix cache)."""
        return self.prompt_tokens - self.cached_tokens


async def iter_sse(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a text/event-stream response; comments and pings are skipped."""
    event, data = "message", []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        yield event, "\n".join(data)


def origin_of(url: str) -> str:
    """scheme://host:port of a URL: the Origin a browser on that server's pages sends."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer header when an API key is used."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def create_session(
    client: httpx.AsyncClient,
    settings: dict[str, Any],
    *,
    system_prompt: str | None = None,
    title: str | None = None,
) -> str:
    """POST /api/sessions (the fields given, the server's defaults for the others); the new session's id."""
    fields = {"title": title, "system_prompt": system_prompt, "settings": settings}
    resp = await client.post("/api/sessions", json={k: v for k, v in fields.items() if v is not None})
    if resp.status_code != 201:
        raise RuntimeError(f"POST /api/sessions answered {resp.status_code}: {resp.text[:500]}")
    return str(resp.json()["id"])


async def send_message(client: httpx.AsyncClient, session_id: str, content: str) -> TurnResult:
    """POST /api/sessions/{id}/messages and read the SSE reply to its `done` (or `error`) event."""
    sent = time.perf_counter()
    result = TurnResult(ok=False)
    pieces: list[str] = []
    try:
        url = f"/api/sessions/{session_id}/messages"
        async with client.stream("POST", url, json={"content": content}) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                raise RuntimeError(f"answered {resp.status_code}: {body[:500]}")
            async with contextlib.aclosing(iter_sse(resp)) as events:
                async for event, data in events:
                    payload = json.loads(data)
                    if event == "delta" and payload.get("text"):
                        if not pieces:
                            result.ttft_s = time.perf_counter() - sent
                        pieces.append(payload["text"])
                    elif event == "done":
                        usage = payload.get("usage") or {}
                        result.prompt_tokens = int(usage.get("prompt_tokens", 0))
                        result.completion_tokens = int(usage.get("completion_tokens", 0))
                        details = usage.get("prompt_tokens_details") or {}
                        result.cached_tokens = int(details.get("cached_tokens", 0))
                        timings = payload.get("timings") or {}
                        result.server_ttft_s = float(timings.get("ttft_s", float("nan")))
                        result.ok = True
                        break
                    elif event == "error":
                        raise RuntimeError(f"error event: {payload.get('message')}")
    except Exception as exc:  # noqa: BLE001 - a failed turn is recorded, the benchmark goes on
        result.error = f"{type(exc).__name__}: {exc}"
    result.e2e_s = time.perf_counter() - sent
    result.text = "".join(pieces)
    return result


async def admin_stats(client: httpx.AsyncClient) -> dict[str, Any] | None:
    """The engine counters of GET /api/admin/state, or None when the admin surface refuses us."""
    try:
        resp = await client.get("/api/admin/state")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return dict(resp.json().get("stats") or {})

"""Shared helpers of the reliability tests: concurrent calls, SSE parsing, the service's own idle check."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.testclient import TestClient

from tests.app.factories import LOOPBACK_CLIENT, SAME_ORIGIN, service_is_idle, sse_events, wait_pool_idle
from tests.faults import marker

HELLO = [{"role": "user", "content": "Hello"}]


def peer(running: TestClient, **kwargs: Any) -> TestClient:
    """Another client of the same running app (its own cookies/headers, the app's Origin), on the app's one loop.

    A TestClient that is not entered runs each request on a loop of its own; the service's streams and reply
    tasks belong to the lifespan's loop, so a peer borrows the running client's portal instead.
    """
    headers = {**SAME_ORIGIN, **kwargs.pop("headers", {})}
    other = TestClient(running.app, **{"client": LOOPBACK_CLIENT, "headers": headers, **kwargs})
    other.portal = running.portal
    return other


def faulty(site: str, text: str = "Tell me a story") -> list[dict[str, str]]:
    """Chat messages whose prompt carries the fault marker of `site`."""
    return [{"role": "user", "content": f"{text} {marker(site)}"}]


def concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls on threads at once; their results in order (an exception re-raises here)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result(timeout=60) for f in futures]


def stream_chat(client: TestClient, body: dict[str, Any]) -> list[str]:
    """POST a streamed /v1/chat/completions; the data field of every SSE event."""
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return [e["data"] for e in sse_events(response.iter_lines())]


def session_events(client: TestClient, sid: str, content: str) -> list[dict[str, Any]]:
    """POST a session message; its SSE events' data as dicts."""
    with client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": content}) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(e["data"]) for e in sse_events(response.iter_lines())]


def wait_service_idle(client: TestClient, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll the admin state until no block is in use, nothing waits and the bridge holds no stream or reply."""
    return wait_pool_idle(client, timeout_s, idle=service_is_idle)

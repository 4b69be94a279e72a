"""bench/common/session_client.py: SSE events parsed from a byte stream."""

from __future__ import annotations

import asyncio

from bench.common.session_client import iter_sse


def test_iter_sse_parses_events():
    class FakeResponse:
        async def aiter_lines(self):
            for line in [
                "event: delta",
                'data: {"text": "Hi"}',
                "",
                ": ping",
                "",
                "data: plain",
                "",
                "event: done",
                "data: {}",
            ]:
                yield line

    async def events() -> list[tuple[str, str]]:
        return [event async for event in iter_sse(FakeResponse())]

    assert asyncio.run(events()) == [
        ("delta", '{"text": "Hi"}'),
        ("message", "plain"),
        ("done", "{}"),
    ]

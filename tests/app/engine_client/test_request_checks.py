"""A request that breaks a limit the engine's fixed facts decide is refused on the event loop, before it is queued:
it does not wait for the engine thread to finish what it is doing (vLLM v1's front-end processor does the same)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.engine_client.async_engine import AsyncEngine
from engine.core.sequence import SamplingParams
from tests.app.factories import make_engine_factory, make_settings, make_tiny_model_dir

WAIT_S = 60.0  # a refusal that waited for the blocked engine thread would never come: fail instead of hanging


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("prompt", "max_tokens", "public_prefix_len", "message"),
    [
        ([1] * 500, 100, 0, r"prompt \(500 tokens\) \+ max_tokens \(100\) exceeds max_model_len \(512\)"),
        ([], 8, 0, "the prompt is empty"),
        ([1, 10**9], 8, 0, "prompt token id 1000000000 is outside the vocabulary"),
        ([1, 2], 8, 3, r"public_prefix_len 3 is outside \[0, 2\]"),
    ],
)
async def test_a_bad_request_is_refused_while_the_engine_thread_is_busy(
    tmp_path, prompt, max_tokens, public_prefix_len, message
):
    engine = AsyncEngine(make_engine_factory(make_settings(tmp_path, make_tiny_model_dir())))
    await engine.start()
    release = threading.Event()
    try:
        busy = asyncio.ensure_future(engine.call(lambda _: release.wait()))  # holds the engine thread
        with pytest.raises(ValueError, match=message):
            await asyncio.wait_for(
                engine.add_request(
                    "r", prompt, SamplingParams(max_tokens=max_tokens), public_prefix_len=public_prefix_len
                ),
                WAIT_S,
            )
        assert not busy.done() and not engine.is_running("r")  # refused while the thread was still held
    finally:
        release.set()
        await busy
        await engine.stop()

"""What the event loop sends the engine thread (commands), how the thread answers, and its warm-up request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core.memory import trim_heap
from engine.core.sequence import SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

WARMUP_TEXT = "Hello"


@dataclass
class AddRequest:
    """Queue a request in the engine; `future` resolves once it is added (or with the engine's ValueError)."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future
    cache_salt: str | None = None
    public_prefix_len: int = 0  # leading prompt tokens outside the salt (engine.core.hash_chain.ChainKey)


@dataclass
class AbortRequest:
    """Abort a request at the next step."""

    request_id: str


@dataclass
class CallOnEngine:
    """Run `fn(engine)` between steps; `future` resolves with its result."""

    fn: Callable[[Any], Any]
    future: asyncio.Future


def resolve(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    """On the future's loop: set its result or exception unless the awaiting side gave up."""
    if future.done():  # the awaiting coroutine was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def answer(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    """From the engine thread: resolve `future` on its own loop (a test client may run its own), if still open."""
    with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits for the answer any more
        future.get_loop().call_soon_threadsafe(resolve, future, result, error)


def warm_up(engine: LLMEngine) -> None:
    """One short greedy request through the whole step path, so /health means the model really runs."""
    prompt = engine.tokenizer.encode(WARMUP_TEXT, add_special_tokens=False) or [0]
    engine.add_request("warmup", prompt, SamplingParams(temperature=0.0, max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    trim_heap()  # what loading and this first step freed goes back to the system before /health says ready

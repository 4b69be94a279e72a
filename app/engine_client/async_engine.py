"""The bridge between asyncio and the synchronous engine: a step loop's thread steps it (app/engine_client/
step_loop.py), coroutines stream its outputs."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from app.engine_client import engine_calls
from app.engine_client.engine_calls import engine_info
from app.engine_client.engine_commands import (
    AbortRequest,
    AddRequest,
    CallOnEngine,
    answer,
    resolve,
    warm_up,
)
from app.engine_client.protocol import EngineOverloaded, EngineUnavailable
from app.engine_client.request_label import RequestLabel
from app.engine_client.request_stream import RequestFailed, RequestStream
from app.engine_client.step_loop import StepLoop
from app.engine_client.stream_registry import StreamRegistry
from engine.core.outputs import RequestOutput
from engine.core.sequence import SamplingParams

if TYPE_CHECKING:
    from app.metrics.metrics import Metrics
    from engine.core.config import EngineConfig
    from engine.core.stats import EngineStats
    from engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)
T = TypeVar("T")
EngineFactory = Callable[[], "LLMEngine"]  # builds the engine, on the engine thread


def engine_factory(config: EngineConfig) -> EngineFactory:
    """Builds the real engine from `config` (imported lazily: torch loads on the engine thread, not at import)."""

    def build() -> LLMEngine:
        from engine.llm_engine import LLMEngine

        return LLMEngine(config)

    return build


class AsyncEngine(StreamRegistry):
    """One engine, stepped by a step loop's thread (app/engine_client/step_loop.py). Requests go in as commands
    through the loop's thread-safe queue; outputs come back on the event loop."""

    def __init__(
        self,
        engine_factory: EngineFactory,
        *,
        max_queued_requests: int = 256,
        request_timeout_s: float = 600.0,
        metrics: Metrics | None = None,
        drain_s: float = 10.0,
        on_death: Callable[[str], None] | None = None,
        step_loop: StepLoop | None = None,
    ) -> None:
        """`drain_s`: at stop, how long the engine may take to write its disk tier's queued blocks. `on_death`: called
        on the event loop with `dead_reason` when the engine thread dies while serving (not at a stop), once its
        requests have failed. `step_loop`: the thread that steps this engine, shared with other engines; unset: one
        of its own."""
        super().__init__(request_timeout_s, metrics)
        # the engine itself, for this client's own thread (and tests); the app reads `info`
        self.engine: LLMEngine | None = None
        # a private copy for the event-loop side; never shared with the engine thread
        self.tokenizer: Any = None
        self.ready = False
        self.dead_reason: str | None = None
        self._factory = engine_factory
        self._max_queued = max_queued_requests
        self.drain_s = drain_s
        self._on_death = on_death
        # the thread that steps the engine: its own, unless it shares one with other engines (app/models/)
        self._step_loop = step_loop or StepLoop()
        self._stopped: asyncio.Future | None = None  # resolved once the step loop has closed the engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._alive = False

    # ---- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Build the engine on a loader thread, run a warm-up request there, then hand it to the step loop; returns
        once it can serve. Other engines of the step loop keep stepping meanwhile."""
        self._loop = asyncio.get_running_loop()
        self._alive = True
        try:
            engine = await asyncio.to_thread(self._build)
        except BaseException as exc:
            if isinstance(exc, ValueError):  # bad input (model, limits): its message says it all
                logger.error("engine failed to start: %s", exc)
            elif not isinstance(exc, asyncio.CancelledError):
                logger.exception("engine failed to start")
            self._alive = False
            self.dead_reason = f"startup failed: {type(exc).__name__}: {exc}"
            raise
        self._stopped = self._loop.create_future()
        self.engine = engine
        self._step_loop.attach(self, engine)
        self.ready = True

    def _build(self) -> LLMEngine:
        engine = self._factory()
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        warm_up(engine)
        self._info = engine_info(engine)
        return engine

    async def stop(self) -> None:
        """Abort what is running, close the engine (its disk tier writes what it queued) and wait for it."""
        self.ready = False
        for request_id in list(self._streams):
            self.abort(request_id)
        if self._stopped is not None and self._alive:
            self._step_loop.detach(self)
            with contextlib.suppress(asyncio.TimeoutError):  # (TimeoutError's alias from Python 3.11 on)
                await asyncio.wait_for(asyncio.shield(self._stopped), 30.0)
        self._alive = False
        self.engine = None  # the step loop holds it no more: its weights and pool go with the last reference
        self._tokenizer_executor.shutdown(wait=False, cancel_futures=True)

    @property
    def healthy(self) -> bool:
        """True while the engine thread serves requests."""
        return self.ready and self._alive and self.dead_reason is None

    def health(self) -> dict[str, Any] | None:
        """The engine replicas for /health: None here (one engine, in this process)."""
        return None

    def replica_report(self) -> None:
        """The replica set for /metrics: None here (one engine; its series carry no replica label)."""
        return None

    @property
    def held_bytes(self) -> int:
        """What the engine holds: its weights and its KV pool (EngineUnavailable before it has started)."""
        return self.info.held_bytes

    def _check_serving(self) -> None:
        if self.dead_reason is not None:
            raise EngineUnavailable(f"the engine is not running: {self.dead_reason}")
        if not self.ready or not self._alive:
            raise EngineUnavailable("the engine is not ready yet")

    # ---- requests -------------------------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        public_prefix_len: int = 0,
        label: RequestLabel | None = None,
        session: str | None = None,
    ) -> RequestStream:
        """Queue a request; raises ValueError (bad input), EngineOverloaded or EngineUnavailable.

        `session`: the chat session the request continues (replicas keep a session's turns on one replica; one
        engine has nothing to choose).

        `cache_salt` (a tenant id) confines the request's prefix-cache hits to requests with the same salt, past its
        first `public_prefix_len` tokens (a published prompt, shared by everyone). `label` says who the request is
        for on the admin page (see `label_of`).
        """
        del session
        self._check_serving()
        assert self.engine is not None
        if params.structured is not None:
            # the grammar's matcher is built here, off the engine thread (cached for the engine's add_request):
            # a schema that fails with this tokenizer is a ValueError (400) before anything is queued
            await asyncio.to_thread(self.engine.check_structured, params.structured)
        limit = self.info.config.max_num_seqs + self._max_queued
        if len(self._streams) >= limit:
            raise EngineOverloaded(
                f"the server is at its limit of {limit} concurrent requests; retry shortly"
            )
        self._check_request(prompt, params, public_prefix_len)  # on the loop: no wait for a step
        stream = self._open_stream(request_id, label)
        future = asyncio.get_running_loop().create_future()
        self._step_loop.put(
            self, AddRequest(request_id, prompt, params, future, cache_salt, public_prefix_len)
        )
        try:
            await future
        except BaseException:
            stream.close()  # also covers cancellation while the add was in flight
            raise
        return stream

    def _cancel(self, request_id: str) -> None:
        """The engine aborts the request at its next step."""
        if self._alive:
            self._step_loop.put(self, AbortRequest(request_id))

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread between steps and return its result."""
        self._check_serving()
        future = asyncio.get_running_loop().create_future()
        self._step_loop.put(self, CallOnEngine(fn, future))
        return await future

    async def call_each(self, fn: Callable[[Any], T]) -> list[tuple[str, T]]:
        """`fn(engine)` on every engine: here the one, named "engine" (replicas: one entry per serving replica)."""
        return [("engine", await self.call(fn))]

    async def stats(self) -> EngineStats:
        """Engine counters taken between steps."""
        return await self.call(engine_calls.stats)

    # ---- called by the step loop, on its thread -----------------------------------------------------------
    def deliver(self, outputs: list[RequestOutput]) -> None:
        self._call_soon(self._dispatch, outputs)

    def step_failed(self, request_ids: list[str], exc: Exception) -> None:
        self._call_soon(
            self._fail, request_ids, RequestFailed(f"engine step failed: {type(exc).__name__}: {exc}")
        )

    def stopped(self) -> None:
        self._alive = False
        if self._stopped is not None:
            self._call_soon(resolve, self._stopped, None)

    def thread_died(self, reason: str) -> None:
        self.dead_reason = reason
        self._alive = False
        self._call_soon(self._on_thread_exit)

    def reject(self, command: Any) -> None:
        """A command that reached the step loop after this engine stopped (or its thread died)."""
        if isinstance(command, (AddRequest, CallOnEngine)):
            reason = self.dead_reason or "the engine was stopped"
            answer(command.future, None, EngineUnavailable(f"the engine is not running: {reason}"))

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(fn, *args)

    def run_command(self, engine: LLMEngine, command: Any, live: set[str]) -> None:
        if isinstance(command, AddRequest):
            try:
                engine.add_request(
                    command.request_id,
                    command.prompt,
                    command.params,
                    cache_salt=command.cache_salt,
                    public_prefix_len=command.public_prefix_len,
                )
            except Exception as exc:  # ValueError: bad input; the caller maps it to 400
                answer(command.future, None, exc)
                return
            live.add(command.request_id)
            answer(command.future, None)
        elif isinstance(command, AbortRequest):
            engine.abort_request(command.request_id)
        elif isinstance(command, CallOnEngine):
            try:
                result = command.fn(engine)
            except Exception as exc:
                answer(command.future, None, exc)
            else:
                answer(command.future, result)

    # ---- on the event loop ----------------------------------------------------------------------------------
    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            request_id = output.request_id
            stream = self._streams.get(request_id)
            try:
                if output.finished and self.metrics is not None:
                    self.metrics.observe_request(output)  # aborted ones too, whose consumer may have gone
                if stream is None:  # its consumer has gone already
                    continue
                stream.push(output)
            except Exception as exc:  # a fault delivering one request's output fails that request only
                logger.exception("delivering an output of request %s failed", request_id)
                if stream is None:
                    continue
                self._streams.pop(request_id, None)
                if not output.finished:
                    self.abort(request_id)
                stream.fail(RequestFailed(f"output delivery failed: {type(exc).__name__}: {exc}"))

    def _fail(self, request_ids: list[str], error: BaseException) -> None:
        for request_id in request_ids:
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.fail(error)

    def _on_thread_exit(self) -> None:
        reason = self.dead_reason or "the engine was stopped"
        self._fail(list(self._streams), RequestFailed(reason))
        if self.dead_reason is not None and self._on_death is not None:
            self._on_death(self.dead_reason)

"""The bridge between asyncio and the synchronous engine: one thread steps it, coroutines stream its outputs.

A little over 300 lines on purpose: the engine thread's loop, its command handling and its shutdown share the
thread's state; split across files they would each need the others' internals.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from app.engine_client import engine_calls
from app.engine_client.engine_calls import engine_info
from app.engine_client.engine_commands import (
    STOP,
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
    """Owns the engine thread. Requests go in through a thread-safe queue; outputs come back on the event loop."""

    def __init__(
        self,
        engine_factory: EngineFactory,
        *,
        max_queued_requests: int = 256,
        request_timeout_s: float = 600.0,
        metrics: Metrics | None = None,
        drain_s: float = 10.0,
        on_death: Callable[[str], None] | None = None,
    ) -> None:
        """`drain_s`: at stop, how long the engine may take to write its disk tier's queued blocks. `on_death`: called
        on the event loop with `dead_reason` when the engine thread dies while serving (not at a stop), once its
        requests have failed."""
        super().__init__(request_timeout_s, metrics)
        # the engine itself, for this client's own thread (and tests); the app reads `info`
        self.engine: LLMEngine | None = None
        # a private copy for the event-loop side; never shared with the engine thread
        self.tokenizer: Any = None
        self.ready = False
        self.dead_reason: str | None = None
        self._factory = engine_factory
        self._max_queued = max_queued_requests
        self._drain_s = drain_s
        self._on_death = on_death
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._alive = False

    # ---- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Build the engine on its thread, run a warm-up request, and return once it can serve."""
        self._loop = asyncio.get_running_loop()
        started: asyncio.Future = self._loop.create_future()
        self._alive = True
        self._thread = threading.Thread(target=self._thread_main, args=(started,), name="engine", daemon=True)
        self._thread.start()
        await started
        self.ready = True

    async def stop(self) -> None:
        """Abort what is running, stop the thread and wait for it."""
        self.ready = False
        for request_id in list(self._streams):
            self.abort(request_id)
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(STOP)
            await asyncio.to_thread(self._thread.join, 30.0)
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
        self._commands.put(AddRequest(request_id, prompt, params, future, cache_salt, public_prefix_len))
        try:
            await future
        except BaseException:
            stream.close()  # also covers cancellation while the add was in flight
            raise
        return stream

    def _cancel(self, request_id: str) -> None:
        """The engine aborts the request at its next step."""
        if self._alive:
            self._commands.put(AbortRequest(request_id))

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run `fn(engine)` on the engine thread between steps and return its result."""
        self._check_serving()
        future = asyncio.get_running_loop().create_future()
        self._commands.put(CallOnEngine(fn, future))
        return await future

    async def call_each(self, fn: Callable[[Any], T]) -> list[tuple[str, T]]:
        """`fn(engine)` on every engine: here the one, named "engine" (replicas: one entry per serving replica)."""
        return [("engine", await self.call(fn))]

    async def stats(self) -> EngineStats:
        """Engine counters taken between steps."""
        return await self.call(engine_calls.stats)

    # ---- the engine thread ----------------------------------------------------------------------------------
    def _thread_main(self, started: asyncio.Future) -> None:
        assert self._loop is not None
        try:
            engine = self._factory()
            self.tokenizer = copy.deepcopy(engine.tokenizer)
            warm_up(engine)
            self._info = engine_info(engine)
            self.engine = engine
        except BaseException as exc:  # noqa: BLE001 - reported to start() and the log
            if isinstance(exc, ValueError):  # bad input (model, limits): its message says it all
                logger.error("engine failed to start: %s", exc)
            else:
                logger.exception("engine failed to start")
            self._alive = False
            self.dead_reason = f"startup failed: {type(exc).__name__}: {exc}"
            self._loop.call_soon_threadsafe(resolve, started, None, exc)
            return
        self._loop.call_soon_threadsafe(resolve, started, None)
        try:
            self._serve(engine)
        except BaseException as exc:  # noqa: BLE001 - the thread must report its death, never vanish
            logger.critical("engine thread died: %s: %s", type(exc).__name__, exc, exc_info=True)
            self.dead_reason = f"engine thread died: {type(exc).__name__}: {exc}"
        finally:
            self._alive = False
            if not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._on_thread_exit)

    def _serve(self, engine: LLMEngine) -> None:
        loop = self._loop
        assert loop is not None
        live: set[str] = set()
        while True:
            block = not engine.has_unfinished_requests()
            while True:
                try:
                    command = self._commands.get(block=block)
                except queue.Empty:
                    break
                block = False
                if command is STOP:
                    for request_id in list(live):
                        engine.abort_request(request_id)
                    engine.close(self._drain_s)  # the disk tier writes what it has queued
                    return
                self._run_command(engine, command, live)
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # the engine fails a step's requests itself; this is the last resort
                logger.exception("engine.step() raised; failing %d in-flight requests", len(live))
                error = RequestFailed(f"engine step failed: {type(exc).__name__}: {exc}")
                for request_id in live:
                    engine.abort_request(request_id)
                loop.call_soon_threadsafe(self._fail, list(live), error)
                live.clear()
                continue
            for output in outputs:
                if output.finished:
                    live.discard(output.request_id)
            if outputs:
                loop.call_soon_threadsafe(self._dispatch, outputs)

    def _run_command(self, engine: LLMEngine, command: Any, live: set[str]) -> None:
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
        while True:  # commands that raced the thread's exit: answer them instead of leaving them hanging
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, (AddRequest, CallOnEngine)):
                resolve(command.future, None, EngineUnavailable(f"the engine is not running: {reason}"))
        if self.dead_reason is not None and self._on_death is not None:
            self._on_death(self.dead_reason)

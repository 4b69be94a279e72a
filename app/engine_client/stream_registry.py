"""What every engine front shares: the live requests' streams, their labels, abort, and the tokenizer thread.

Two fronts give the app one interface (`EngineClient`, app/engine_client/protocol.py): `AsyncEngine` (one engine
on a thread of this process) and `ReplicaSetEngine` (engine replicas on Ray Serve). Each says how a request is sent,
how one is cancelled (`_cancel`) and how a function reaches each engine between its steps (`call_each`); the
registry of streams and the figures asked of every engine are here, once.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from app.engine_client import engine_calls
from app.engine_client.protocol import EngineInfo, EngineUnavailable, PoolSample
from app.engine_client.request_stream import ABORTED, RequestStream
from engine.core.limits import check_prompt

if TYPE_CHECKING:
    from app.engine_client.request_label import RequestLabel
    from app.metrics.metrics import Metrics
    from engine.core.outputs import CachePurge
    from engine.core.sequence import SamplingParams
    from engine.core.stats import EngineStats, PoolSnapshot

T = TypeVar("T")


class StreamRegistry(ABC):
    """The streams of the requests in flight, by request id, and the calls every engine answers. Subclasses define
    `_check_serving`, `_cancel` (stop the request where it runs) and `call_each`, set `_info` once the engine
    serves, and add `add_request` as `EngineClient` says."""

    tokenizer: Any

    def __init__(self, request_timeout_s: float, metrics: Metrics | None) -> None:
        self.metrics = metrics
        self._info: EngineInfo | None = None
        self._timeout_s = request_timeout_s
        self._streams: dict[str, RequestStream] = {}
        # every tokenizer call of the event-loop side runs here: off the loop, and never two at once
        self._tokenizer_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")

    # ---- to define ------------------------------------------------------------------------------------------
    @abstractmethod
    def _check_serving(self) -> None:
        """Raise EngineUnavailable unless requests can be served now."""

    @abstractmethod
    def _cancel(self, request_id: str) -> None:
        """Stop the request where it runs (its stream is taken care of)."""

    @abstractmethod
    async def call_each(self, fn: Callable[[Any], T]) -> list[tuple[str, T]]:
        """`fn(engine)` on every serving engine between its steps, as (name, result) in rank order."""

    # ---- what every engine answers --------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        """The engine's fixed facts (EngineUnavailable before it has started)."""
        if self._info is None:
            raise EngineUnavailable("the engine is not ready yet")
        return self._info

    def _check_request(self, prompt: list[int], params: SamplingParams, public_prefix_len: int) -> None:
        """The checks that need only the engine's fixed facts, on the event loop before anything is queued (the
        engine's own `add_request` runs the same ones, engine/core/limits.py): ValueError naming what is wrong."""
        info = self.info
        check_prompt(
            prompt,
            params.max_tokens,
            public_prefix_len,
            vocab_size=info.vocab_size,
            max_model_len=info.max_model_len,
        )

    async def stats_each(self) -> list[tuple[str, EngineStats]]:
        return await self.call_each(engine_calls.stats)

    async def snapshot_each(self) -> list[tuple[str, PoolSnapshot]]:
        return await self.call_each(engine_calls.snapshot)

    async def pool_sample_each(self, hashed: Callable[[int], range]) -> list[tuple[str, PoolSample]]:
        return await self.call_each(engine_calls.PoolSampler(hashed))

    async def purge_cache_salt(self, cache_salt: str) -> list[CachePurge]:
        return [purge for _, purge in await self.call_each(engine_calls.SaltPurger(cache_salt))]

    # ---- shared ---------------------------------------------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_pending_outputs(self) -> int:
        """Outputs delivered but not yet taken by their consumers (bounded: at most one per stream)."""
        return sum(stream.num_pending for stream in self._streams.values())

    def _open_stream(self, request_id: str, label: RequestLabel | None) -> RequestStream:
        """A new request's stream, registered (ValueError: the id is taken)."""
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = RequestStream(
            request_id, self._timeout_s, abort=self.abort, unregister=self._unregister, metrics=self.metrics
        )
        stream.label = label
        self._streams[request_id] = stream
        return stream

    def _unregister(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def label_of(self, request_id: str) -> RequestLabel | None:
        """Who a live request is for, as its submitter labelled it (None: unlabelled, or its stream has ended)."""
        stream = self._streams.get(request_id)
        return stream.label if stream is not None else None

    def abort(self, request_id: str) -> None:
        """Abort a request (callable from the event loop without awaiting): its stream ends, then the request."""
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.aborted = True
            stream.push(ABORTED)
        self._cancel(request_id)

    def is_running(self, request_id: str) -> bool:
        """Whether the request's stream is still open."""
        return request_id in self._streams

    def end_request(self, request_id: str, error: BaseException) -> bool:
        """Fail one running request's stream with `error` (its consumer raises it) and stop the request; False when
        it was not running."""
        stream = self._streams.get(request_id)
        if stream is None or stream.aborted or stream.finished:
            return False
        stream.fail(error)
        self._cancel(request_id)
        return True

    def end_streams(self, error: BaseException) -> int:
        """Fail every stream still running with `error` (shutdown) and stop its request; returns how many."""
        running = [(rid, s) for rid, s in self._streams.items() if not (s.aborted or s.finished)]
        for request_id, stream in running:
            stream.fail(error)
            self._cancel(request_id)
        return len(running)

    async def tokenize(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(tokenizer)` on the tokenizer thread, with the loop side's private tokenizer copy."""
        self._check_serving()
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_executor, fn, self.tokenizer)

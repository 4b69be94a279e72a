"""One request's outputs as an async iterator: timeout, abort on close, latency metrics, and its exceptions."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from app.engine_client.merging_queue import MergingQueue
from engine.core.outputs import RequestOutput

if TYPE_CHECKING:
    from app.engine_client.request_label import RequestLabel
    from app.metrics.metrics import Metrics

ABORTED = object()  # queued into a stream when the service aborts its request
TIMED_OUT = object()  # queued by the stream's own timer


class RequestFailed(RuntimeError):
    """The engine failed this request (a fault in its step, its detokenization, or a dead engine thread)."""


class ReplicaLost(RequestFailed):
    """The engine replica serving the request died (replicas on Ray Serve): the reply was cut where it stood."""


class ServerShuttingDown(RequestFailed):
    """The server is shutting down and its grace period is over: the request was cut (HTTP 503)."""


class RequestTimedOut(RuntimeError):
    """The request ran past the per-request timeout and was aborted."""


class RequestStream:
    """One request's outputs in order. `async for` them; closing the stream early aborts the request."""

    def __init__(
        self,
        request_id: str,
        timeout_s: float,
        *,
        abort: Callable[[str], None],
        unregister: Callable[[str], None],
        metrics: Metrics | None = None,
    ) -> None:
        self.request_id = request_id
        self.label: RequestLabel | None = None  # who it is for, on the admin page
        self.finished = False
        self.aborted = False
        self.last: RequestOutput | None = None
        self._abort = abort
        self._unregister = unregister
        self._metrics = metrics
        # Pending items. A consumer that falls behind (a slow reader) finds consecutive outputs merged into one,
        # so what waits here stays one output (text deltas joined) plus sentinels, whatever the reader's pace.
        self._items: MergingQueue[Any] = MergingQueue(_merge_pending)
        self._timeout_s = timeout_s
        self._started = time.monotonic()
        self._last_token_time: float | None = None
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._items.put, TIMED_OUT)

    @property
    def num_pending(self) -> int:
        """Items waiting for the consumer (at most one output, thanks to merging, plus sentinels)."""
        return len(self._items)

    def push(self, item: Any) -> None:
        """Called on the event loop by the bridge; records token latencies as outputs arrive."""
        if isinstance(item, RequestOutput) and self._metrics is not None:
            num_new = max((o.num_new_tokens for o in item.outputs), default=0)
            if num_new:
                now = time.monotonic()
                if self._last_token_time is None:
                    self._metrics.observe_first_token(now - self._started)
                else:
                    self._metrics.observe_inter_token((now - self._last_token_time) / num_new, num_new)
                self._last_token_time = now
        self._items.put(item)

    def fail(self, error: BaseException) -> None:
        """Deliver an exception: the consumer raises it once the outputs before it are taken."""
        self._items.put(error)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._items.get()
        if isinstance(item, RequestOutput):
            self.last = item
            if item.error is not None:
                self._done("error")
                raise RequestFailed(item.error)
            if item.finished:
                reason = item.outputs[0].finish_reason if item.outputs else None
                self._done(reason.value if reason is not None else "abort")
            return item
        if item is ABORTED:
            self.aborted = True
            self._done("abort")
            raise StopAsyncIteration
        if item is TIMED_OUT:
            self.aborted = True
            self._done("timeout")
            self._abort(self.request_id)
            raise RequestTimedOut(
                f"request {self.request_id} exceeded the {self._timeout_s:g} s request timeout"
            )
        self._done("error")
        raise item  # an exception delivered by the bridge

    def _done(self, reason: str) -> None:
        """Mark the stream finished once: stop the timer, unregister, count the request's end."""
        if self.finished:
            return
        self.finished = True
        self._timer.cancel()
        self._unregister(self.request_id)
        if self._metrics is not None:
            self._metrics.observe_finished(reason, time.monotonic() - self._started)

    def close(self) -> None:
        """Stop consuming: abort the request at the next step unless it already finished."""
        if not self.finished:
            self.aborted = True
            self._items.put(ABORTED)  # wakes a consumer blocked in __anext__
            self._done("abort")
            self._abort(self.request_id)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _merge_pending(last: Any, item: Any) -> RequestOutput | None:
    """A new output joins the pending one unless that one is final (sentinels and errors never merge)."""
    if isinstance(item, RequestOutput) and isinstance(last, RequestOutput) and not last.finished:
        return merge_outputs(last, item)
    return None


def merge_outputs(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One output standing for two consecutive ones: the later state, with the text deltas and token counts joined."""
    before = {o.index: o for o in earlier.outputs}
    outputs = []
    for out in later.outputs:
        prev = before.pop(out.index, None)
        if prev is not None:
            out = dataclasses.replace(
                out,
                text_delta=prev.text_delta + out.text_delta,
                num_new_tokens=prev.num_new_tokens + out.num_new_tokens,
            )
        outputs.append(out)
    outputs.extend(before.values())  # a sample missing from the later output keeps its pending delta
    outputs.sort(key=lambda o: o.index)
    return dataclasses.replace(later, outputs=outputs)


async def collect(
    stream: RequestStream, receive: Callable[[], Awaitable[dict[str, Any]]]
) -> RequestOutput | None:
    """Run a request to its end; None (and an abort) if the ASGI client disconnects first."""

    async def consume() -> RequestOutput | None:
        last = None
        async with stream:
            async for output in stream:
                last = output
            return None if stream.aborted else last

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            stream.close()
            task.cancel()
    if task.cancelled():
        return None
    return task.result()

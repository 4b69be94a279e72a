"""One session reply: its event stream, and the writer that streams it from the engine into the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.conversation import PromptPlan
from app.db import MessageRecord, Store, StoreUnavailable
from app.errors import from_exception
from app.merging_queue import MergingQueue
from app.request_stream import RequestFailed, RequestStream, RequestTimedOut
from engine.core.outputs import RequestOutput

logger = logging.getLogger(__name__)
# every reply ends with one `done`; its message.status says how it ended (finished, stopped, failed, ...)
TERMINAL_EVENTS = ("done",)


def message_json(m: MessageRecord) -> dict[str, Any]:
    """A stored message as the API shows it (token ids left out: they are the server's business)."""
    return {
        "id": m.id,
        "role": m.role,
        "content": m.content,
        "status": m.status,
        "finish_reason": m.finish_reason,
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.completion_tokens,
        "cached_tokens": m.cached_tokens,
        "truncated_turns": m.truncated_turns,
        "timings": m.timings,
        "error": m.error,
        "created_at": m.created_at.isoformat(),
    }


@dataclass
class Reply:
    """One reply being generated: its events go to whoever streams it (SSE or WebSocket).

    Events wait in `events` until the client takes them; consecutive `delta` events are merged there, so a slow
    reader holds at most the reply's text, never one object per token.
    """

    session_id: str
    request_id: str
    events: MergingQueue[dict[str, Any]] = field(default_factory=lambda: MergingQueue(_merge_deltas))
    task: asyncio.Task | None = None
    stream: RequestStream | None = None
    stop_requested: bool = False
    # how an aborted reply is stored: "stopped" (the user's stop) or "interrupted" (a dropped connection)
    stop_status: str = "stopped"

    def emit(self, event: dict[str, Any]) -> None:
        self.events.put(event)

    async def iter_events(self) -> AsyncIterator[dict[str, Any]]:
        """Events until (and including) the final `done`."""
        while True:
            event = await self.events.get()
            yield event
            if event["type"] in TERMINAL_EVENTS:
                return


class ReplyWriter:
    """Streams replies from the engine to their events, flushes their text, and stores how they ended."""

    def __init__(
        self, store: Store, fingerprint: str, flush_interval_s: float, store_retry_s: float = 10.0
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.flush_interval_s = flush_interval_s
        self.store_retry_s = store_retry_s

    async def run(self, turn: Reply, plan: PromptPlan) -> None:
        """Stream the reply into its events, flushing its text; always store it and end with `done`."""
        stream = turn.stream
        assert stream is not None
        text, error, status = "", None, "finished"
        last: RequestOutput | None = None
        record: MessageRecord | None = None
        flushed_at, flushed_len = time.monotonic(), 0
        # Flushes never hold up the stream: they run in the background, one at a time; while the database is busy
        # or down they fail quietly (the row is then created late) and the final write retries the whole reply.
        writing: asyncio.Task | None = None
        try:
            async with stream:
                async for output in stream:
                    if last is None:  # the row exists before the first delta, unless the database is down
                        with contextlib.suppress(StoreUnavailable):
                            record = await self.start_assistant(
                                turn.session_id, plan, output.num_cached_tokens
                            )
                        turn.emit(
                            {
                                "type": "assistant_start",
                                "message_id": record.id if record else None,
                                "cached_tokens": output.num_cached_tokens,
                            }
                        )
                    last = output
                    delta = output.outputs[0].text_delta
                    if delta:
                        text += delta
                        turn.emit({"type": "delta", "text": delta})
                    now = time.monotonic()
                    if writing is not None and writing.done():
                        if record is None:
                            record = _result_or_none(writing)
                        writing = None
                    if (
                        writing is None
                        and len(text) != flushed_len
                        and now - flushed_at >= self.flush_interval_s
                    ):
                        flushed_at, flushed_len = now, len(text)
                        if record is None:
                            create = self.start_assistant(turn.session_id, plan, output.num_cached_tokens)
                            writing = asyncio.ensure_future(create)
                        else:
                            writing = asyncio.ensure_future(self.store.flush_assistant(record.id, text))
            if stream.aborted:
                status = turn.stop_status
        except (RequestFailed, RequestTimedOut) as exc:
            status, error = "failed", from_exception(exc).message
        except asyncio.CancelledError:
            status = "interrupted"
        except Exception as exc:  # noqa: BLE001 - a bug here must still end the turn and store what there is
            logger.exception("turn %s failed", turn.request_id)
            status, error = "failed", f"internal error: {type(exc).__name__}"
        finally:
            await asyncio.shield(self._complete(turn, plan, record, writing, last, text, status, error))

    async def _complete(
        self,
        turn: Reply,
        plan: PromptPlan,
        record: MessageRecord | None,
        writing: asyncio.Task | None,
        last: RequestOutput | None,
        text: str,
        status: str,
        error: str | None,
    ) -> None:
        out = last.outputs[0] if last is not None else None
        cached = last.num_cached_tokens if last is not None else 0
        reason = out.finish_reason.value if out is not None and out.finish_reason is not None else None
        if status in ("stopped", "interrupted"):
            reason = "abort"
        token_ids = list(out.token_ids) if out is not None else []
        timings = _timings(last)
        if writing is not None:
            await asyncio.wait([writing])
            if record is None:
                record = _result_or_none(writing)

        async def store_final() -> None:
            nonlocal record
            if record is None:
                record = await self.start_assistant(turn.session_id, plan, cached)
            await self.finish(record.id, text, status, reason, token_ids, timings, error)

        try:
            await _retry_while_unavailable(store_final, self.store_retry_s)
        except StoreUnavailable as exc:
            logger.error("turn %s: the reply could not be stored: %s", turn.request_id, exc)
            error = error or f"the reply could not be stored: {exc}"
        except Exception as exc:  # noqa: BLE001 - e.g. the session was deleted meanwhile; the client still gets done
            logger.warning(
                "turn %s: the reply was not stored: %s: %s", turn.request_id, type(exc).__name__, exc
            )
            error = error or f"the reply was not stored: {type(exc).__name__}"
        usage = {
            "prompt_tokens": len(plan.token_ids),
            "completion_tokens": len(token_ids),
            "total_tokens": len(plan.token_ids) + len(token_ids),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        message = {
            "id": record.id if record else None,
            "role": "assistant",
            "content": text,
            "status": status,
            "finish_reason": reason,
            "prompt_tokens": len(plan.token_ids),
            "completion_tokens": len(token_ids),
            "cached_tokens": cached,
            "truncated_turns": plan.truncated_turns,
            "timings": timings,
            "error": error,
        }
        turn.emit({"type": "done", "message": message, "usage": usage, "timings": timings})

    async def start_assistant(self, session_id: str, plan: PromptPlan, cached_tokens: int) -> MessageRecord:
        """The assistant row, created as `streaming`."""
        return await self.store.start_assistant(
            session_id,
            prompt_tokens=len(plan.token_ids),
            cached_tokens=cached_tokens,
            truncated_turns=plan.truncated_turns,
            tokenizer_fingerprint=self.fingerprint,
        )

    async def finish(
        self,
        message_id: int,
        text: str,
        status: str,
        reason: str | None,
        token_ids: list[int],
        timings: dict[str, float],
        error: str | None,
    ) -> None:
        """The assistant row's final text, status, token ids and timings."""
        await self.store.finish_assistant(
            message_id,
            content=text,
            status=status,
            finish_reason=reason,
            token_ids=token_ids,
            completion_tokens=len(token_ids),
            timings=timings,
            error=error,
        )


def _merge_deltas(last: dict[str, Any], event: dict[str, Any]) -> dict[str, Any] | None:
    if last["type"] == "delta" and event["type"] == "delta":
        return {"type": "delta", "text": last["text"] + event["text"]}
    return None


def _result_or_none(task: asyncio.Task) -> Any:
    """A finished write's result; None when it failed (its error was expected: the database was unavailable)."""
    if task.cancelled() or task.exception() is not None:
        if not task.cancelled() and not isinstance(task.exception(), StoreUnavailable):
            logger.error("a background write failed", exc_info=task.exception())
        return None
    return task.result()


async def _retry_while_unavailable(write: Callable[[], Awaitable[Any]], retry_s: float) -> Any:
    """Run `write`, retrying while the database is unavailable, for up to `retry_s` seconds."""
    deadline = time.monotonic() + retry_s
    pause = 0.05
    while True:
        try:
            return await write()
        except StoreUnavailable:
            if time.monotonic() + pause > deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)


def _timings(last: RequestOutput | None) -> dict[str, float]:
    """Seconds to the first token and in total, and decode speed, from the engine's monotonic timestamps."""
    if last is None:
        return {}
    arrival, first = last.metrics.arrival_time, last.metrics.first_token_time
    end = last.metrics.finished_time if last.metrics.finished_time is not None else time.monotonic()
    timings: dict[str, float] = {}
    if arrival is not None:
        timings["total_s"] = round(end - arrival, 4)
        if first is not None:
            timings["ttft_s"] = round(first - arrival, 4)
    num_tokens = len(last.outputs[0].token_ids) if last.outputs else 0
    if first is not None and num_tokens > 1 and end > first:
        timings["decode_tokens_per_s"] = round((num_tokens - 1) / (end - first), 2)
    return timings

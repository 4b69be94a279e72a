"""One session reply: its event stream, and the writer that streams it from the engine into the store."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.chat.conversation import PromptPlan
from app.db import MessageRecord, MessageStatus, Store, StoreUnavailable
from app.engine_client.merging_queue import MergingQueue
from app.engine_client.request_stream import (
    ReplicaLost,
    RequestFailed,
    RequestStream,
    RequestTimedOut,
    ServerShuttingDown,
)
from app.http.errors import from_exception
from app.http.messages import message_fields, usage_json
from engine.core.outputs import PromptProgress, RequestOutput
from engine.core.sequence import FinishReason

logger = logging.getLogger(__name__)
# every reply ends with one `done`; its message.status says how it ended (finished, stopped, failed, ...)
TERMINAL_EVENTS = ("done",)
# how a reply cut short is stored: stopped (the user's stop) or interrupted (its client went away, or the server
# shut down: the user did not ask for it, and the chat page shows a dropped reply as interrupted too)
CUT_STATUSES = (MessageStatus.STOPPED, MessageStatus.INTERRUPTED)
SHUTDOWN = "shutdown"  # the `reason` of a `done` event when the server's shutdown cut the reply
REPLICA_LOST = (
    "replica_lost"  # ... when the engine replica serving it died (the next turn goes to a live one)
)


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
    # how an aborted reply is stored: stopped (the user's stop) or interrupted (a dropped connection, a shutdown)
    stop_status: MessageStatus = MessageStatus.STOPPED
    stop_reason: str | None = None  # SHUTDOWN when the server's shutdown cut it: its `done` event says so
    engine: Any = None  # the engine client of the chat's model, which runs it (None: the default model's)
    # seconds the turn waited for its model to load before the engine had it (None: the model was loaded); the
    # engine's own timings start at its arrival there, so `done` reports the wait beside them
    model_load_s: float | None = None

    def emit(self, event: dict[str, Any]) -> None:
        self.events.put(event)

    async def iter_events(self) -> AsyncIterator[dict[str, Any]]:
        """Events until (and including) the final `done`."""
        while True:
            event = await self.events.get()
            yield event
            if event["type"] in TERMINAL_EVENTS:
                return


@dataclass(frozen=True)
class ReplyPlace:
    """Where a reply goes in its session's tree: after the user message `parent_id`, beside the replies it had;
    or, continuing, into the reply `resumed` (its row grows: text and ids after `prior_text` / `prior_token_ids`)."""

    parent_id: int
    sibling_ids: tuple[int, ...] = ()  # the user message's replies before this one
    resumed: int | None = None
    prior_text: str = ""
    prior_token_ids: tuple[int, ...] = ()

    def event_fields(self, message_id: int | None) -> dict[str, Any]:
        """The reply's place as `assistant_start` shows it: parent, versions (itself included; its index is None
        while the database is down and its row not yet written), continuing."""
        siblings = self.sibling_ids
        if self.resumed is None and message_id is not None:
            siblings = (*siblings, message_id)
        return {
            "parent_id": self.parent_id,
            "sibling_ids": list(siblings),
            "sibling_index": siblings.index(message_id) if message_id in siblings else None,
            "continues": self.resumed is not None,
        }


@dataclass(frozen=True)
class FinalReply:
    """How a reply ended: what its row stores, and the message its `done` event shows."""

    id: int | None  # its row; None when the row could not be stored
    content: str
    status: MessageStatus
    finish_reason: str | None
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    truncated_turns: int
    timings: dict[str, float]
    error: str | None
    parent_id: int | None = None
    role: str = "assistant"
    reason: str | None = None  # why it was cut, when the client did not ask (SHUTDOWN)
    dropped: bool = False  # stopped before its first token: not stored (the user message ends the branch)
    num_prior_tokens: int = (
        0  # a continued reply: its tokens before this request (in token_ids, not in usage)
    )
    draft_tokens: int = 0  # speculative decoding: tokens proposed and verified, and of those the ones kept
    accepted_tokens: int = 0

    @property
    def completion_tokens(self) -> int:
        """The whole reply's tokens (a continued one's included)."""
        return len(self.token_ids)

    def done_event(self) -> dict[str, Any]:
        """The reply's last event; `usage` counts this request's tokens."""
        usage = usage_json(
            self.prompt_tokens,
            self.completion_tokens - self.num_prior_tokens,
            self.cached_tokens,
            self.draft_tokens,
            self.accepted_tokens,
        )
        event = {"type": "done", "message": message_fields(self), "usage": usage, "timings": self.timings}
        if self.reason is not None:
            event["reason"] = self.reason
        if self.dropped:
            event["dropped"] = True
        return event


@dataclass
class _Draft:
    """A reply as far as it has come: its row (once created), the background write in flight, the last output."""

    plan: PromptPlan
    place: ReplyPlace
    text: str = ""  # this request's text (a continued reply's whole text: place.prior_text + text)
    last: RequestOutput | None = None
    record: MessageRecord | None = None
    writing: asyncio.Task | None = None
    flushed_at: float = field(default_factory=time.monotonic)
    flushed_len: int = 0

    def take_write(self) -> None:
        """Collect the background write once it is done (the row it created, if it created one)."""
        if self.writing is not None and self.writing.done():
            if self.record is None:
                self.record = _result_or_none(self.writing)
            self.writing = None

    def stopped_unstarted(self, status: MessageStatus) -> bool:
        """The user's Stop came before the first token of a new reply: nothing to keep (as the CLI does). A
        continued reply keeps its row; a reply cut any other way keeps its (empty) row, so the page can say why."""
        return status is MessageStatus.STOPPED and self.last is None and self.place.resumed is None

    def final(self, status: MessageStatus, error: str | None) -> FinalReply:
        """The reply ending here with `status` (the row id is filled in once stored)."""
        out = self.last.outputs[0] if self.last is not None else None
        reason = out.finish_reason.value if out is not None and out.finish_reason is not None else None
        if status in CUT_STATUSES:
            reason = FinishReason.ABORT.value
        prior = self.place.prior_token_ids
        return FinalReply(
            id=None,
            content=self.place.prior_text + self.text,
            status=status,
            finish_reason=reason,
            token_ids=[*prior, *(out.token_ids if out is not None else ())],
            num_prior_tokens=len(prior),
            parent_id=self.place.parent_id,
            prompt_tokens=len(self.plan.token_ids),
            cached_tokens=self.last.num_cached_tokens if self.last is not None else 0,
            draft_tokens=out.num_draft_tokens if out is not None else 0,
            accepted_tokens=out.num_accepted_tokens if out is not None else 0,
            truncated_turns=self.plan.truncated_turns,
            timings=_timings(self.last),
            error=error,
        )


class ReplyWriter:
    """Streams replies from the engine to their events, flushes their text, and stores how they ended."""

    def __init__(
        self, store: Store, fingerprint: str, flush_interval_s: float, store_retry_s: float = 10.0
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.flush_interval_s = flush_interval_s
        self.store_retry_s = store_retry_s

    async def run(self, turn: Reply, plan: PromptPlan, place: ReplyPlace) -> None:
        """Stream the reply into its events, flushing its text; always store it and end with `done`."""
        stream = turn.stream
        assert stream is not None
        draft = _Draft(plan, place)
        status, error = MessageStatus.FINISHED, None
        try:
            async with stream:
                async for output in stream:
                    await self._take(turn, draft, output)
            if stream.aborted:
                status = turn.stop_status
        except ServerShuttingDown:  # cut by the shutdown before its session's stop reached it
            status, turn.stop_reason = MessageStatus.INTERRUPTED, SHUTDOWN
        except ReplicaLost as exc:  # cut, not failed: what it wrote is kept, and the chat goes on elsewhere
            status, error, turn.stop_reason = (
                MessageStatus.INTERRUPTED,
                from_exception(exc).message,
                REPLICA_LOST,
            )
        except (RequestFailed, RequestTimedOut) as exc:
            status, error = MessageStatus.FAILED, from_exception(exc).message
        except asyncio.CancelledError:
            status = MessageStatus.INTERRUPTED
        except Exception as exc:  # noqa: BLE001 - a bug here must still end the turn and store what there is
            logger.exception("turn %s failed", turn.request_id)
            status, error = MessageStatus.FAILED, f"internal error: {type(exc).__name__}"
        finally:
            final = draft.final(status, error)
            if turn.model_load_s is not None:
                final = dataclasses.replace(
                    final, timings={**final.timings, "model_load_s": round(turn.model_load_s, 4)}
                )
            if status in CUT_STATUSES:
                final = dataclasses.replace(final, reason=turn.stop_reason)
            if draft.stopped_unstarted(status):
                assert draft.record is None and draft.writing is None, (
                    "no row is written before the first token"
                )
                turn.emit(dataclasses.replace(final, dropped=True).done_event())
            else:
                await asyncio.shield(self._complete(turn, draft, final))

    async def _take(self, turn: Reply, draft: _Draft, output: RequestOutput) -> None:
        """One output: its text goes out as a delta at once; the row catches up in the background. Before the
        first token, the prompt's progress goes out as `progress` events (the row is made with the first token)."""
        if output.is_progress_report:
            turn.emit(progress_event(output.progress))
            return
        if draft.last is None:  # the row exists before the first delta, unless the database is down
            with contextlib.suppress(StoreUnavailable):
                draft.record = await self.start_assistant(turn.session_id, draft, output.num_cached_tokens)
            message_id = draft.record.id if draft.record else draft.place.resumed
            turn.emit(
                {
                    "type": "assistant_start",
                    "message_id": message_id,
                    "cached_tokens": output.num_cached_tokens,
                    **draft.place.event_fields(message_id),
                }
            )
        draft.last = output
        delta = output.outputs[0].text_delta
        if delta:
            draft.text += delta
            turn.emit({"type": "delta", "text": delta})
        # Flushes never hold up the stream: they run in the background, one at a time; while the database is busy
        # or down they fail quietly (the row is then created late) and the final write retries the whole reply.
        draft.take_write()
        now = time.monotonic()
        if (
            draft.writing is None
            and len(draft.text) != draft.flushed_len
            and now - draft.flushed_at >= self.flush_interval_s
        ):
            draft.flushed_at, draft.flushed_len = now, len(draft.text)
            if draft.record is None:
                write = self.start_assistant(turn.session_id, draft, output.num_cached_tokens)
            else:
                write = self.store.chats.flush_assistant(draft.record.id, draft.place.prior_text + draft.text)
            draft.writing = asyncio.ensure_future(write)

    async def _complete(self, turn: Reply, draft: _Draft, final: FinalReply) -> None:
        """Store the reply's final state (retrying while the database is down), then send `done`."""
        if draft.writing is not None:
            await asyncio.wait([draft.writing])
            draft.take_write()
        error = final.error

        async def store_final() -> None:
            if draft.record is None:
                draft.record = await self.start_assistant(turn.session_id, draft, final.cached_tokens)
            await self.finish(draft.record.id, final)

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
        record_id = draft.record.id if draft.record else None
        turn.emit(dataclasses.replace(final, id=record_id, error=error).done_event())

    async def store_unstarted(self, session_id: str, plan: PromptPlan, place: ReplyPlace, error: str) -> None:
        """Store a reply the engine refused as failed and empty: user and assistant turns keep alternating."""
        draft = _Draft(plan, place)
        record = await self.start_assistant(session_id, draft, 0)
        await self.finish(record.id, draft.final(MessageStatus.FAILED, error))

    async def start_assistant(self, session_id: str, draft: _Draft, cached_tokens: int) -> MessageRecord:
        """The assistant row, created (or, continuing, resumed) as `streaming`."""
        plan, place = draft.plan, draft.place
        if place.resumed is not None:
            return await self.store.chats.resume_assistant(
                place.resumed,
                prompt_tokens=len(plan.token_ids),
                cached_tokens=cached_tokens,
                truncated_turns=plan.truncated_turns,
                tokenizer_fingerprint=self.fingerprint,
            )
        return await self.store.chats.start_assistant(
            session_id,
            prompt_tokens=len(plan.token_ids),
            cached_tokens=cached_tokens,
            truncated_turns=plan.truncated_turns,
            tokenizer_fingerprint=self.fingerprint,
            parent_id=place.parent_id,
        )

    async def finish(self, message_id: int, final: FinalReply) -> None:
        """The assistant row's final text, status, token ids and timings."""
        await self.store.chats.finish_assistant(
            message_id,
            content=final.content,
            status=final.status,
            finish_reason=final.finish_reason,
            token_ids=final.token_ids,
            completion_tokens=final.completion_tokens,
            timings=final.timings,
            error=final.error,
        )


def progress_event(progress: PromptProgress) -> dict[str, Any]:
    """How far the prompt has been read: `processed` of `total` tokens (`cached` of them from the prefix cache), and
    the place in the queue while it waits (1: next; None: it runs)."""
    return {
        "type": "progress",
        "total": progress.total,
        "cached": progress.cached,
        "processed": progress.processed,
        "queue_position": progress.queue_position,
    }


def _merge_deltas(last: dict[str, Any], event: dict[str, Any]) -> dict[str, Any] | None:
    if last["type"] == "delta" and event["type"] == "delta":
        return {"type": "delta", "text": last["text"] + event["text"]}
    if last["type"] == "progress" and event["type"] == "progress":  # a slow reader gets the newest
        return event
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

"""Session chat: store the user turn, stream the reply from the engine, keep its token ids for the next turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from app.async_engine import AsyncEngine
from app.conversation import ConversationBuilder, PromptPlan, turns_from_messages
from app.db import MessageRecord, SessionRecord, Store, StoreUnavailable
from app.errors import APIError, bad_request, from_exception, not_found
from app.request_stream import RequestFailed, RequestStream, RequestTimedOut
from app.routes.params import sampling_params
from app.settings import Settings
from engine.outputs import RequestOutput
from engine.sequence import SamplingParams

logger = logging.getLogger(__name__)
TERMINAL_EVENTS = ("done",)  # every reply ends with one `done`; its message.status says how (finished ... failed)
SESSION_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed",
                         "presence_penalty", "frequency_penalty", "repetition_penalty")


def message_json(m: MessageRecord) -> dict[str, Any]:
    """A stored message as the API shows it (token ids left out: they are the server's business)."""
    return {
        "id": m.id, "role": m.role, "content": m.content, "status": m.status, "finish_reason": m.finish_reason,
        "prompt_tokens": m.prompt_tokens, "completion_tokens": m.completion_tokens,
        "cached_tokens": m.cached_tokens, "truncated_turns": m.truncated_turns, "timings": m.timings,
        "error": m.error, "created_at": m.created_at.isoformat(),
    }


@dataclass
class Reply:
    """One reply being generated: its events go to whoever streams it (SSE or WebSocket)."""

    session_id: str
    request_id: str
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    stream: RequestStream | None = None
    stop_requested: bool = False

    def emit(self, event: dict[str, Any]) -> None:
        self.events.put_nowait(event)

    async def iter_events(self) -> AsyncIterator[dict[str, Any]]:
        """Events until (and including) the final `done`."""
        while True:
            event = await self.events.get()
            yield event
            if event["type"] in TERMINAL_EVENTS:
                return


class ChatService:
    """Runs session turns: one reply at a time per session, each reply an independent task."""

    def __init__(self, store: Store, engine: AsyncEngine, settings: Settings, builder: ConversationBuilder,
                 fingerprint: str) -> None:
        self.store = store
        self.engine = engine
        self.settings = settings
        self.builder = builder
        self.fingerprint = fingerprint
        self._turns: dict[str, Reply | None] = {}  # None: reserved while the turn is being set up

    def is_streaming(self, session_id: str) -> bool:
        return session_id in self._turns

    def stop(self, session_id: str) -> bool:
        """Abort the session's streaming reply (it is stored as `stopped`); False when nothing streams."""
        turn = self._turns.get(session_id)
        if turn is None:
            return False
        turn.stop_requested = True
        self.engine.abort(turn.request_id)  # the stream then ends as aborted and the reply is stored as stopped
        return True

    async def shutdown(self, timeout_s: float) -> None:
        """Let running replies finish up to `timeout_s`, then stop them; each is stored before returning."""
        tasks = [t.task for t in self._turns.values() if t is not None and t.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for session_id in list(self._turns):
                self.stop(session_id)
            if pending:
                await asyncio.wait(pending, timeout=5.0)

    async def send(self, owner: str, session_id: str, content: Any) -> Reply:
        """Store a new user message and start its reply."""
        return await self._begin(owner, session_id, "send", content)

    async def regenerate(self, owner: str, session_id: str) -> Reply:
        """Replace the last reply with a new one."""
        return await self._begin(owner, session_id, "regenerate", None)

    async def edit(self, owner: str, session_id: str, content: Any) -> Reply:
        """Replace the last user message (and its reply) with `content`, and answer it."""
        return await self._begin(owner, session_id, "edit", content)

    # ---- setup ----------------------------------------------------------------------------------------------
    async def _begin(self, owner: str, session_id: str, mode: str, content: Any) -> Reply:
        if session_id in self._turns:
            raise APIError(409, "a reply is still streaming in this session: stop it or wait for it to finish",
                           code="reply_in_progress")
        self._turns[session_id] = None  # reserved before the first await, so a racing second send sees 409
        try:
            return await self._setup(owner, session_id, mode, content)
        except BaseException:
            self._turns.pop(session_id, None)
            raise

    async def _setup(self, owner: str, session_id: str, mode: str, content: Any) -> Reply:
        if mode != "regenerate":
            content = self._check_content(content)
        session = await self.store.get_session(owner, session_id)
        messages = await self.store.list_messages(owner, session_id)
        if session is None or messages is None:
            raise not_found(f"session {session_id[:64]!r}")
        params, max_tokens = self._params(session)
        history = messages
        if mode in ("regenerate", "edit"):
            last_user = next((m for m in reversed(messages) if m.role == "user"), None)
            if last_user is None:
                raise bad_request(f"nothing to {mode}: the session has no user message yet")
            if mode == "regenerate":
                content = last_user.content
            history = [m for m in messages if m.position < last_user.position]
        turns = turns_from_messages(history, self.fingerprint)
        system_prompt = session.system_prompt
        plan: PromptPlan = await self.engine.tokenize(
            lambda _tok: self.builder.build_prompt(system_prompt, turns, content, max_tokens)
        )
        if mode in ("regenerate", "edit"):
            await self.store.delete_messages_from(session_id, last_user.id)
        user = await self.store.add_message(session_id, "user", content, token_ids=plan.new_user_token_ids)
        turn = Reply(session_id, "chat-" + uuid.uuid4().hex)
        try:
            turn.stream = await self.engine.add_request(turn.request_id, plan.token_ids, params)
        except Exception as exc:  # keep user/assistant alternation: record the failed reply, then report
            with contextlib.suppress(StoreUnavailable):
                record = await self._start_assistant(session_id, plan, 0)
                await self._finish(record.id, "", "failed", None, [], {}, from_exception(exc).message)
            raise
        logger.info("session %s turn %s: %d prompt tokens (%d turns left out, exact=%s), max_tokens %d",
                    session_id, turn.request_id, len(plan.token_ids), plan.truncated_turns, plan.exact_extension,
                    max_tokens)
        turn.emit({"type": "start", "session_id": session_id, "request_id": turn.request_id,
                   "user_message": message_json(user), "prompt_tokens": len(plan.token_ids),
                   "truncated_turns": plan.truncated_turns, "exact_extension": plan.exact_extension})
        self._turns[session_id] = turn
        turn.task = asyncio.create_task(self._run(turn, plan), name=f"turn-{turn.request_id}")
        return turn

    def _check_content(self, content: Any) -> str:
        if not isinstance(content, str) or not content.strip():
            raise bad_request("content must be a non-empty string", "content")
        if len(content) > self.settings.max_message_chars:
            raise bad_request(f"content is {len(content)} characters, over the limit of "
                              f"{self.settings.max_message_chars}", "content")
        return content

    def _params(self, session: SessionRecord) -> tuple[SamplingParams, int]:
        settings = {k: v for k, v in (session.settings or {}).items() if k in SESSION_SAMPLING_KEYS}
        max_tokens = settings.get("max_tokens") or self.settings.default_max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise bad_request(f"session setting max_tokens must be a positive integer, got {max_tokens!r}",
                              "max_tokens")
        assert self.engine.engine is not None
        max_tokens = min(max_tokens, self.engine.engine.config.max_model_len // 2)
        return sampling_params(settings, max_tokens=max_tokens, logprobs=None), max_tokens

    # ---- the reply ------------------------------------------------------------------------------------------
    async def _run(self, turn: Reply, plan: PromptPlan) -> None:
        stream = turn.stream
        assert stream is not None
        text, error, status = "", None, "finished"
        last: RequestOutput | None = None
        record: MessageRecord | None = None
        flushed_at, flushed_len = time.monotonic(), 0
        try:
            async with stream:
                async for output in stream:
                    last = output
                    if record is None:
                        record = await self._start_assistant(turn.session_id, plan, output.num_cached_tokens)
                        turn.emit({"type": "assistant_start", "message_id": record.id if record else None,
                                   "cached_tokens": output.num_cached_tokens})
                    delta = output.outputs[0].text_delta
                    if delta:
                        text += delta
                        turn.emit({"type": "delta", "text": delta})
                    now = time.monotonic()
                    if record is not None and len(text) != flushed_len and now - flushed_at >= \
                            self.settings.flush_interval_s:
                        flushed_at, flushed_len = now, len(text)
                        with contextlib.suppress(StoreUnavailable):  # the final write retries the whole text
                            await self.store.flush_assistant(record.id, text)
            if stream.aborted:
                status = "stopped"
        except (RequestFailed, RequestTimedOut) as exc:
            status, error = "failed", from_exception(exc).message
        except asyncio.CancelledError:
            status = "interrupted"
        except Exception as exc:  # noqa: BLE001 - a bug here must still end the turn and store what there is
            logger.exception("turn %s failed", turn.request_id)
            status, error = "failed", f"internal error: {type(exc).__name__}"
        finally:
            try:
                await asyncio.shield(self._complete(turn, plan, record, last, text, status, error))
            finally:
                self._turns.pop(turn.session_id, None)

    async def _complete(self, turn: Reply, plan: PromptPlan, record: MessageRecord | None,
                        last: RequestOutput | None, text: str, status: str, error: str | None) -> None:
        out = last.outputs[0] if last is not None else None
        cached = last.num_cached_tokens if last is not None else 0
        reason = out.finish_reason.value if out is not None and out.finish_reason is not None else None
        if status == "stopped":
            reason = "abort"
        token_ids = list(out.token_ids) if out is not None else []
        timings = _timings(last)
        try:
            if record is None:
                record = await self._start_assistant(turn.session_id, plan, cached)
            await self._finish(record.id, text, status, reason, token_ids, timings, error)
        except StoreUnavailable as exc:
            logger.error("turn %s: the reply could not be stored: %s", turn.request_id, exc)
            error = error or f"the reply could not be stored: {exc}"
        usage = {"prompt_tokens": len(plan.token_ids), "completion_tokens": len(token_ids),
                 "total_tokens": len(plan.token_ids) + len(token_ids),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        message = {"id": record.id if record else None, "role": "assistant", "content": text, "status": status,
                   "finish_reason": reason, "prompt_tokens": len(plan.token_ids), "completion_tokens": len(token_ids),
                   "cached_tokens": cached, "truncated_turns": plan.truncated_turns, "timings": timings,
                   "error": error}
        turn.emit({"type": "done", "message": message, "usage": usage, "timings": timings})

    async def _start_assistant(self, session_id: str, plan: PromptPlan, cached_tokens: int) -> MessageRecord:
        return await self.store.start_assistant(
            session_id, prompt_tokens=len(plan.token_ids), cached_tokens=cached_tokens,
            truncated_turns=plan.truncated_turns, tokenizer_fingerprint=self.fingerprint,
        )

    async def _finish(self, message_id: int, text: str, status: str, reason: str | None, token_ids: list[int],
                      timings: dict[str, float], error: str | None) -> None:
        await self.store.finish_assistant(message_id, content=text, status=status, finish_reason=reason,
                                          token_ids=token_ids, completion_tokens=len(token_ids), timings=timings,
                                          error=error)


def _timings(last: RequestOutput | None) -> dict[str, float]:
    """Seconds to the first token and in total, and decode speed, from the engine's monotonic timestamps."""
    if last is None:
        return {}
    m = last.metrics
    arrival, first = m.get("arrival_time"), m.get("first_token_time")
    end = m.get("finished_time", time.monotonic())
    timings: dict[str, float] = {}
    if arrival is not None:
        timings["total_s"] = round(end - arrival, 4)
        if first is not None:
            timings["ttft_s"] = round(first - arrival, 4)
    num_tokens = len(last.outputs[0].token_ids) if last.outputs else 0
    if first is not None and num_tokens > 1 and end > first:
        timings["decode_tokens_per_s"] = round((num_tokens - 1) / (end - first), 2)
    return timings

"""Session chat: store the user turn, stream the reply from the engine, keep its token ids for the next turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from enum import Enum
from typing import Any

from app.db import MessageStatus, Store, StoreUnavailable
from app.services.async_engine import AsyncEngine
from app.services.chat_reply import CUT_STATUSES, SHUTDOWN, Reply, ReplyWriter
from app.services.chat_settings import (
    chat_max_tokens,
    effective_settings,
    effective_system_prompt,
)
from app.services.conversation import ConversationBuilder, PromptPlan, Turn, turns_from_messages
from app.services.errors import APIError, bad_request, from_exception, not_found
from app.services.limits import Lease
from app.services.messages import message_json
from app.services.public_prefix import PublicPrefixes
from app.services.request_label import chat_label
from app.services.sampling import sampling_params
from app.settings import Settings
from engine.core.sampling_defaults import BUILTIN, SamplingDefaults
from engine.core.sequence import SamplingParams

logger = logging.getLogger(__name__)


class ReplyMode(str, Enum):
    """How a turn's reply starts: after a new user message, in place of the last reply, or after an edited one."""

    SEND = "send"
    REGENERATE = "regenerate"
    EDIT = "edit"

    def __str__(self) -> str:
        return self.value


class ChatService:
    """Runs session turns: one reply at a time per session, each reply an independent task."""

    def __init__(
        self,
        store: Store,
        engine: AsyncEngine,
        settings: Settings,
        builder: ConversationBuilder,
        fingerprint: str,
        public_prefixes: PublicPrefixes | None = None,
        sampling_defaults: SamplingDefaults = BUILTIN,
    ) -> None:
        self.sampling_defaults = sampling_defaults  # for the settings a session leaves unset
        self.store = store
        self.public_prefixes = public_prefixes
        self.engine = engine
        self.settings = settings
        self.builder = builder
        self.fingerprint = fingerprint
        self.writer = ReplyWriter(store, fingerprint, settings.flush_interval_s, settings.store_retry_s)
        self._turns: dict[str, Reply | None] = {}  # None: reserved while the turn is being set up
        self._cut_all = False  # set at shutdown: a reply that starts from then on is cut at once

    @property
    def num_streaming(self) -> int:
        """Sessions with a reply being set up or streamed."""
        return len(self._turns)

    def is_streaming(self, session_id: str) -> bool:
        return session_id in self._turns

    def stop(
        self, session_id: str, status: MessageStatus = MessageStatus.STOPPED, reason: str | None = None
    ) -> bool:
        """Abort the session's streaming reply, stored with `status`; False when idle.

        `stopped`: the user asked (Stop button, POST …/stop); `interrupted`: the client went away or stopped
        reading, or the server shut down (`reason` SHUTDOWN). The first reason given wins: a Stop followed by the
        tab closing stays `stopped`.
        """
        assert status in CUT_STATUSES, f"a stopped reply is stored as one of {CUT_STATUSES}, not {status!r}"
        turn = self._turns.get(session_id)
        if turn is None:
            return False
        if not turn.stop_requested:
            turn.stop_requested = True
            turn.stop_status = status
            turn.stop_reason = reason
        self.engine.abort(turn.request_id)  # its stream ends as aborted; the reply is stored as stop_status
        return True

    def stop_reply(self, reply: Reply, status: MessageStatus = MessageStatus.STOPPED) -> bool:
        """Stop this reply if it is still its session's running reply (never a newer one); False otherwise."""
        if self._turns.get(reply.session_id) is not reply or (
            reply.stream is not None and reply.stream.finished
        ):
            return False
        return self.stop(reply.session_id, status)

    def cut_all(self) -> int:
        """The shutdown's grace period is over: stop every running reply (`interrupted`, its `done` saying
        `shutdown`), and any that starts later at once; returns how many were stopped."""
        self._cut_all = True
        return sum(self.stop(sid, MessageStatus.INTERRUPTED, SHUTDOWN) for sid in list(self._turns))

    async def shutdown(self, timeout_s: float, store_wait_s: float = 5.0) -> None:
        """Let running replies finish up to `timeout_s`, then cut them; waits up to `store_wait_s` more for them
        to be stored."""
        tasks = [t.task for t in self._turns.values() if t is not None and t.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            self.cut_all()
            if pending:
                await asyncio.wait(pending, timeout=store_wait_s)

    async def start(
        self, mode: ReplyMode, owner: str, session_id: str, content: Any = None, lease: Lease | None = None
    ) -> Reply:
        """Start a reply: SEND stores `content` as a new user message and answers it; REGENERATE replaces the last
        reply; EDIT replaces the last user message (and its reply) with `content`. `lease` (a client limit's slot)
        is released when the reply ends."""
        try:
            if session_id in self._turns:
                raise APIError(
                    409,
                    "a reply is still streaming in this session: stop it or wait for it to finish",
                    code="reply_in_progress",
                )
            # reserved before the first await, so a racing second send sees 409
            self._turns[session_id] = None
            try:
                reply = await self._setup(owner, session_id, mode, content)
            except BaseException:
                self._turns.pop(session_id, None)
                raise
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        if lease is not None:
            assert reply.task is not None
            reply.task.add_done_callback(lambda _task: lease.release())
        return reply

    # ---- setup ----------------------------------------------------------------------------------------------
    async def _setup(self, owner: str, session_id: str, mode: ReplyMode, content: Any) -> Reply:
        if mode is not ReplyMode.REGENERATE:
            content = self._check_content(content)
        session = await self.store.get_session(owner, session_id)
        messages = await self.store.list_messages(owner, session_id)
        if session is None or messages is None:
            raise not_found(f"session {session_id[:64]!r}")
        preset = await self.store.get_preset(owner, session.preset_id) if session.preset_id else None
        params, max_tokens = self._params(effective_settings(session, preset))
        history = messages
        if mode is not ReplyMode.SEND:
            last_user = next((m for m in reversed(messages) if m.role == "user"), None)
            if last_user is None:
                raise bad_request(f"nothing to {mode}: the session has no user message yet", "session")
            if mode is ReplyMode.REGENERATE:
                content = last_user.content
            history = [m for m in messages if m.position < last_user.position]
        turns = turns_from_messages(history, self.fingerprint)
        system_prompt = effective_system_prompt(session, preset, self.settings.default_system_prompt)
        plan, public_prefix_len = await self.engine.tokenize(
            lambda _tok: self._plan(system_prompt, turns, content, max_tokens)
        )
        if mode is ReplyMode.SEND:
            user = await self.store.add_message(
                session_id, "user", content, token_ids=plan.new_user_token_ids
            )
        else:  # one transaction: a refused write (quota) leaves the last turn in place
            user = await self.store.replace_messages_from(
                session_id, last_user.id, content, token_ids=plan.new_user_token_ids
            )
        turn = Reply(session_id, "chat-" + uuid.uuid4().hex)
        try:
            turn.stream = await self.engine.add_request(
                turn.request_id,
                plan.token_ids,
                params,
                cache_salt=owner if self.settings.prefix_cache_isolation else None,
                public_prefix_len=public_prefix_len,
                label=chat_label(session.title, owner),
            )
        except Exception as exc:  # keep user/assistant alternation: record the failed reply, then report
            with contextlib.suppress(StoreUnavailable):
                await self.writer.store_unstarted(session_id, plan, from_exception(exc).message)
            raise
        logger.info(
            "session %s turn %s: %d prompt tokens (%d turns left out, exact=%s), max_tokens %d",
            session_id,
            turn.request_id,
            len(plan.token_ids),
            plan.truncated_turns,
            plan.exact_extension,
            max_tokens,
        )
        turn.emit(
            {
                "type": "start",
                "session_id": session_id,
                "request_id": turn.request_id,
                "user_message": message_json(user),
                "prompt_tokens": len(plan.token_ids),
                "truncated_turns": plan.truncated_turns,
                "exact_extension": plan.exact_extension,
            }
        )
        self._turns[session_id] = turn
        turn.task = asyncio.create_task(self._drive(turn, plan), name=f"turn-{turn.request_id}")
        if self._cut_all:  # set up while the shutdown cut the others
            self.stop(session_id, MessageStatus.INTERRUPTED, SHUTDOWN)
        return turn

    def _plan(
        self, system_prompt: str, turns: list[Turn], content: str, max_tokens: int
    ) -> tuple[PromptPlan, int]:
        """The turn's prompt and its public prefix length (on the tokenizer thread)."""
        plan = self.builder.build_prompt(system_prompt, turns, content, max_tokens)
        public = self.public_prefixes
        return plan, public.session_length(system_prompt, plan.token_ids) if public is not None else 0

    def _check_content(self, content: Any) -> str:
        if not isinstance(content, str) or not content.strip():
            raise bad_request("content must be a non-empty string", "content")
        if len(content) > self.settings.max_message_chars:
            raise bad_request(
                f"content is {len(content)} characters, over the limit of {self.settings.max_message_chars}",
                "content",
            )
        return content

    def _params(self, settings: dict[str, Any]) -> tuple[SamplingParams, int]:
        max_tokens = settings.get("max_tokens") or self.settings.default_max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise bad_request(
                f"session setting max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens"
            )
        assert self.engine.engine is not None
        max_tokens = chat_max_tokens(max_tokens, self.engine.engine.config.max_model_len)
        params = sampling_params(
            settings, max_tokens=max_tokens, logprobs=None, defaults=self.sampling_defaults.given()
        )
        return params, max_tokens

    async def _drive(self, reply: Reply, plan: PromptPlan) -> None:
        try:
            await self.writer.run(reply, plan)
        finally:
            self._turns.pop(reply.session_id, None)

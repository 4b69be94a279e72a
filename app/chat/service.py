"""Session chat: store the user turn, stream the reply from the engine, keep its token ids for the next turn."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from app.chat.attachments import AttachmentReader
from app.chat.branches import (
    Fork,
    ReplyMode,
    Target,
    locate,
    message_id_value,
    path_json,
    turn_target,
    with_siblings,
)
from app.chat.chat_settings import (
    MODEL_KEY,
    chat_max_tokens,
    effective_settings,
    effective_system_prompt,
)
from app.chat.conversation import (
    ConversationBuilder,
    PromptPlan,
    Turn,
    template_end_of_turn_ids,
    tokenizer_fingerprint,
    turns_from_messages,
)
from app.chat.documents import prompt_content
from app.chat.reply import CUT_STATUSES, SHUTDOWN, Reply, ReplyPlace, ReplyWriter
from app.chat.truncation import ContextFull, PromptTooLong, Truncate
from app.db import (
    AttachmentRecord,
    MessageRecord,
    MessageStatus,
    MessageTree,
    Parent,
    PresetRecord,
    SessionRecord,
    Store,
    StoreUnavailable,
)
from app.engine_client.protocol import EngineClient
from app.engine_client.request_label import chat_label
from app.http.errors import APIError, bad_request, from_exception, not_found
from app.http.limits import Lease
from app.http.model_registry import ModelHandle, ModelRegistry
from app.http.public_prefix import PublicPrefixes
from app.http.sampling import sampling_params
from app.http.services import Services
from app.settings import Settings
from engine.core.sampling_defaults import BUILTIN, SamplingDefaults
from engine.core.sequence import SamplingParams

logger = logging.getLogger(__name__)
__all__ = ["ChatService", "ReplyMode"]


@dataclass(frozen=True)
class ChatModel:
    """A served model as the chat uses it: its engine, its conversation builder (template, context), the
    fingerprint its token ids are stored under, and the defaults and published prefixes of its tokenizer."""

    name: str
    engine: EngineClient
    builder: ConversationBuilder
    fingerprint: str
    public_prefixes: PublicPrefixes | None
    sampling_defaults: SamplingDefaults
    writer: ReplyWriter


class ChatService:
    """Runs session turns: one reply at a time per session, each reply an independent task. A turn runs on its
    chat's model (the setting `model`; unset: the server's --model), loaded first if it is not."""

    def __init__(
        self,
        store: Store,
        engine: EngineClient,
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
        self.attachments = AttachmentReader(settings)  # uploads' text (app/chat/attachment_routes.py)
        self._turns: dict[str, Reply | None] = {}  # None: reserved while the turn is being set up
        self.models: ModelRegistry | None = None  # the served models (`serve_models`); None: only this engine
        self.default_model = ChatModel(
            "", engine, builder, fingerprint, public_prefixes, sampling_defaults, self.writer
        )
        self._chat_models: dict[str, ChatModel] = {}
        self._waiting_for_model: set[str] = set()  # sessions whose turn waits for its model to load
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
        engine = turn.engine if turn.engine is not None else self.engine
        engine.abort(turn.request_id)  # its stream ends as aborted; the reply is stored as stop_status
        return True

    def stop_reply(
        self, reply: Reply, status: MessageStatus = MessageStatus.STOPPED, reason: str | None = None
    ) -> bool:
        """Stop this reply if it is still its session's running reply (never a newer one); False otherwise."""
        if self._turns.get(reply.session_id) is not reply or (
            reply.stream is not None and reply.stream.finished
        ):
            return False
        return self.stop(reply.session_id, status, reason)

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
        self,
        mode: ReplyMode,
        owner: str,
        session_id: str,
        content: Any = None,
        lease: Lease | None = None,
        target: Target = Parent.ACTIVE_LEAF,
        truncate: Truncate | None = None,
        attachments: Any = None,
    ) -> Reply:
        """Start a reply (app/chat/branches.py): SEND stores `content` as a new user message after `target`
        (a reply; None: a new first message) and answers it; EDIT stores `content` beside the user message
        `target`; REGENERATE answers the user message of `target` again, beside its replies; CONTINUE extends the
        reply `target`. `target` defaults to the active leaf. `lease` (a client limit's slot) is released when the
        reply ends. A history that does not fit is cut only as `truncate` says: without it, 409 `context_full`
        (app/chat/truncation.py). `attachments` (SEND, EDIT): ids of the session's unsent attachments the new message
        carries; an edited message's own attachments carry over to its new version."""
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
                reply = await self._setup(owner, session_id, mode, content, target, truncate, attachments)
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

    async def switch_branch(self, owner: str, session_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Show the branch through `fields["message_id"]` (its newest continuation); the new active path as
        `path_json` shows it. 409 while a reply streams in the session (it is growing the branch on show)."""
        message_id = message_id_value(fields, "message_id")
        if session_id in self._turns:
            raise APIError(
                409,
                "a reply is still streaming in this session: switch branches once it has ended",
                code="reply_in_progress",
            )
        try:
            tree = await self.store.chats.switch_branch(owner, session_id, message_id)
        except ValueError as exc:
            raise bad_request(str(exc), "message_id") from None
        if tree is None:
            raise not_found(f"session {session_id[:64]!r}")
        return path_json(tree)

    # ---- setup ----------------------------------------------------------------------------------------------
    async def load_chat(
        self, owner: str, session_id: str
    ) -> tuple[SessionRecord, MessageTree, PresetRecord | None]:
        """The owner's session, its message tree and its preset (None: none); 404 when the owner has no such
        session."""
        session = await self.store.chats.get_session(owner, session_id)
        tree = await self.store.chats.get_tree(owner, session_id)
        if session is None or tree is None:
            raise not_found(f"session {session_id[:64]!r}")
        preset = await self.store.presets.get_preset(owner, session.preset_id) if session.preset_id else None
        return session, tree, preset

    async def plan(self, owner: str, session_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        """What sending `fields["content"]` (with the unsent `attachments` named) after `parent_id` (default: the
        active leaf) would need, planned as a send plans it (on the tokenizer thread); nothing is stored and no
        engine request is made."""
        # no content: the history alone, as the page asks when the chat's model changes (it is read again)
        content = "" if fields.get("content") is None else self._check_content(fields.get("content"))
        attachment_ids = self._attachment_ids(ReplyMode.SEND, fields.get("attachments"))
        target = turn_target(ReplyMode.SEND, fields)
        session, tree, preset = await self.load_chat(owner, session_id)
        settings = effective_settings(session, preset)
        model = self.loaded_model(settings.get(MODEL_KEY))  # another model not loaded: the default's count
        _, max_tokens = self.sampling(settings, model)
        fork = locate(ReplyMode.SEND, tree, target)
        turns = turns_from_messages(fork.history, model.fingerprint)
        system_prompt = effective_system_prompt(session, preset, self.settings.default_system_prompt)
        text = prompt_content(await self._files(owner, session_id, attachment_ids, ()), content)
        report = await model.engine.tokenize(
            lambda _tok: model.builder.context_report(system_prompt, turns, text, max_tokens)
        )
        return report.to_json()

    async def _setup(
        self,
        owner: str,
        session_id: str,
        mode: ReplyMode,
        content: Any,
        target: Target,
        truncate: Truncate | None,
        attachments: Any,
    ) -> Reply:
        attachment_ids = self._attachment_ids(mode, attachments)
        if mode in (ReplyMode.SEND, ReplyMode.EDIT):
            content = self._check_content(content)
        session, tree, preset = await self.load_chat(owner, session_id)
        settings = effective_settings(session, preset)
        asked_at, must_load = time.monotonic(), self.must_load(settings)
        async with self.model_of(settings, session_id) as model:
            load_s = time.monotonic() - asked_at if must_load else None
            return await self._setup_on(model, owner, session, tree, preset, settings, mode, content, target,
                                        truncate, attachment_ids, load_s)  # fmt: skip

    async def _setup_on(
        self,
        model: ChatModel,
        owner: str,
        session: SessionRecord,
        tree: MessageTree,
        preset: PresetRecord | None,
        settings: dict[str, Any],
        mode: ReplyMode,
        content: Any,
        target: Target,
        truncate: Truncate | None,
        attachment_ids: list[int],
        model_load_s: float | None,
    ) -> Reply:
        session_id = session.id
        params, max_tokens = self.sampling(settings, model)
        fork = locate(mode, tree, target)
        if (
            mode is ReplyMode.REGENERATE
        ):  # the old reply stays as a version: one more message, as a new turn's
            await self.store.chats.check_reply_room(session_id)
        carried = fork.edited.attachments if fork.edited is not None else ()
        files = await self._files(owner, session_id, attachment_ids, carried)
        # the files' blocks, then the question: the prompt reads them at the same place in every later turn
        text = (
            prompt_content(files, content)
            if fork.user is None
            else prompt_content(fork.user.attachments, fork.user.content)
        )
        turns = turns_from_messages(fork.history, model.fingerprint)
        system_prompt = effective_system_prompt(session, preset, self.settings.default_system_prompt)
        try:
            (plan, prior_ids), public_prefix_len = await model.engine.tokenize(
                lambda _tok: self._plan(
                    model, system_prompt, turns, text, fork.continued, max_tokens, truncate
                )
            )
        except (
            ContextFull
        ) as full:  # nothing stored: the page asks the user what to leave out, then sends again
            raise APIError(
                409, str(full), code="context_full", extra={"context": full.report.to_json()}
            ) from None
        except PromptTooLong as too_long:
            raise APIError(
                400,
                str(too_long),
                param="content",
                code="prompt_too_long",
                extra={"context": too_long.report.to_json()},
            ) from None
        if fork.user is None:  # SEND, EDIT: the new user message (a refused write, quota, changes nothing)
            user = await self.store.chats.add_message(
                session_id,
                "user",
                content,
                token_ids=plan.new_user_token_ids,
                parent_id=fork.user_parent_id,
                attachment_ids=attachment_ids,
                attachments_of=fork.edited.id if carried and fork.edited is not None else None,
            )
            user_json = with_siblings(user, (*tree.child_ids(user.parent_id), user.id))
        else:
            user = fork.user
            user_json = with_siblings(user, tree.sibling_ids(user.id))
        place = self._place(tree, fork, user, prior_ids)
        turn = Reply(session_id, "chat-" + uuid.uuid4().hex, engine=model.engine, model_load_s=model_load_s)
        try:
            turn.stream = await model.engine.add_request(
                turn.request_id,
                plan.token_ids,
                params,
                cache_salt=owner if self.settings.prefix_cache_isolation else None,
                public_prefix_len=public_prefix_len,
                label=chat_label(session.title, owner),
                session=session_id,
            )
        except Exception as exc:  # a new user message keeps its turn: record the failed reply, then report
            if fork.user is None:
                with contextlib.suppress(StoreUnavailable):
                    await model.writer.store_unstarted(session_id, plan, place, from_exception(exc).message)
            raise
        logger.info(
            "session %s turn %s (%s): %d prompt tokens (%d turns left out, exact=%s), max_tokens %d",
            session_id,
            turn.request_id,
            mode,
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
                "mode": mode.value,
                "model": model.name or self._default_name,
                "user_message": user_json,
                "prompt_tokens": len(plan.token_ids),
                "truncated_turns": plan.truncated_turns,
                "exact_extension": plan.exact_extension,
            }
        )
        self._turns[session_id] = turn
        turn.task = asyncio.create_task(
            self._drive(turn, plan, place, model.writer), name=f"turn-{turn.request_id}"
        )
        if self._cut_all:  # set up while the shutdown cut the others
            self.stop(session_id, MessageStatus.INTERRUPTED, SHUTDOWN)
        return turn

    @staticmethod
    def _place(tree: MessageTree, fork: Fork, user: MessageRecord, prior_ids: list[int]) -> ReplyPlace:
        """Where the reply goes: a new version among the user message's replies, or into the continued one."""
        if fork.continued is None:
            return ReplyPlace(user.id, tree.child_ids(user.id) if fork.user is not None else ())
        continued = fork.continued
        return ReplyPlace(
            user.id,
            tree.sibling_ids(continued.id),
            resumed=continued.id,
            prior_text=continued.content,
            prior_token_ids=tuple(prior_ids),
        )

    def _plan(
        self,
        model: ChatModel,
        system_prompt: str,
        turns: list[Turn],
        content: str,
        continued: MessageRecord | None,
        max_tokens: int,
        truncate: Truncate | None,
    ) -> tuple[tuple[PromptPlan, list[int]], int]:
        """The turn's prompt (continuing: and the ids of the reply so far) and its public prefix length (on the
        tokenizer thread)."""
        if continued is None:
            plan = model.builder.build_prompt(system_prompt, turns, content, max_tokens, truncate)
            prior_ids: list[int] = []
        else:
            ids = (
                continued.token_ids if continued.tokenizer_fingerprint in (None, model.fingerprint) else None
            )
            answer = Turn("assistant", continued.content, ids)
            plan, prior_ids = model.builder.build_continuation(
                system_prompt, turns, content, answer, max_tokens, truncate
            )
        public = model.public_prefixes
        public_len = public.session_length(system_prompt, plan.token_ids) if public is not None else 0
        return (plan, prior_ids), public_len

    def _attachment_ids(self, mode: ReplyMode, value: Any) -> list[int]:
        """The `attachments` of a turn: a list of distinct attachment ids (SEND and EDIT only); 400 otherwise."""
        if value is None or value == []:
            return []
        if mode not in (ReplyMode.SEND, ReplyMode.EDIT):
            raise bad_request(
                f"attachments go with a new or an edited message, not with {mode}", "attachments"
            )
        limit = self.settings.max_attachments_per_message
        if (
            not isinstance(value, list)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
            or len(set(value)) != len(value)
        ):
            raise bad_request("attachments must be a list of distinct attachment ids", "attachments")
        if len(value) > limit:
            raise bad_request(
                f"{len(value)} attachments, over the limit of {limit} (max_attachments_per_message)",
                "attachments",
            )
        return list(value)

    async def _files(
        self, owner: str, session_id: str, ids: list[int], carried: tuple[AttachmentRecord, ...]
    ) -> tuple[AttachmentRecord, ...]:
        """The files a new user message carries, in the order they will be stored: the unsent ones named (by id),
        then an edited message's."""
        limit = self.settings.max_attachments_per_message
        if len(ids) + len(carried) > limit:
            raise bad_request(
                f"the edited message carries {len(carried)} files: {len(ids)} more pass the limit of {limit} "
                "(max_attachments_per_message)",
                "attachments",
            )
        if not ids:
            return carried
        try:
            found = await self.store.chats.unsent_attachments(owner, session_id, ids)
        except ValueError as exc:
            raise bad_request(str(exc), "attachments") from None
        if found is None:
            raise not_found(f"session {session_id[:64]!r}")
        return (*sorted(found, key=lambda a: a.id), *carried)

    def _check_content(self, content: Any) -> str:
        if not isinstance(content, str) or not content.strip():
            raise bad_request("content must be a non-empty string", "content")
        if len(content) > self.settings.max_message_chars:
            raise bad_request(
                f"content is {len(content)} characters, over the limit of {self.settings.max_message_chars}",
                "content",
            )
        return content

    def sampling(
        self, settings: dict[str, Any], model: ChatModel | None = None
    ) -> tuple[SamplingParams, int]:
        """A turn's sampling params and max_tokens from a chat's effective settings (400 for a bad max_tokens), with
        `model`'s defaults (None: the default model's)."""
        model = model or self.default_model
        settings = {k: v for k, v in settings.items() if k != MODEL_KEY}
        max_tokens = settings.get("max_tokens") or self.settings.default_max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise bad_request(
                f"session setting max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens"
            )
        max_tokens = chat_max_tokens(max_tokens, model.engine.info.max_model_len)
        params = sampling_params(
            settings, max_tokens=max_tokens, logprobs=None, defaults=model.sampling_defaults.given()
        )
        # the page shows how far the prompt has been read (or the place in the queue) until the first token
        return dataclasses.replace(params, report_progress=True), max_tokens

    # ---- the chat's models -------------------------------------------------------------------------------------
    def serve_models(self, models: ModelRegistry) -> None:
        """Run each chat on its own model (the setting `model`) among `models`; the default one is this engine."""
        self.models = models

    @contextlib.asynccontextmanager
    async def model_of(
        self, settings: dict[str, Any], session_id: str | None = None
    ) -> AsyncIterator[ChatModel]:
        """The model a chat with these effective settings runs on, loaded first if it is not (the page shows the
        wait; `waiting_for_model(session_id)` says so meanwhile); hold it until its engine has the request (a lease
        keeps the model loaded). 409 `model_not_served` when the chat names a model no longer served."""
        if self.models is None:
            yield self.default_model
            return
        name = self._served_model_name(settings.get(MODEL_KEY))
        waiting = session_id is not None and self.must_load(settings)
        if waiting:
            self._waiting_for_model.add(session_id)
        try:
            async with self.models.lease(name) as handle:
                self._waiting_for_model.discard(session_id or "")
                yield await self._chat_model(handle)
        finally:
            if waiting:
                self._waiting_for_model.discard(session_id or "")

    def must_load(self, settings: dict[str, Any]) -> bool:
        """Whether the model a chat with these settings runs on is not loaded now (its turn waits for the load)."""
        if self.models is None:
            return False
        return self.models.get(self._served_model_name(settings.get(MODEL_KEY))).handle is None

    def waiting_for_model(self, session_id: str) -> bool:
        """Whether the session's turn is waiting for its model to load (a Stop then cancels the turn)."""
        return session_id in self._waiting_for_model

    @property
    def _default_name(self) -> str:
        return self.models.default_name if self.models is not None else ""

    def _served_model_name(self, name: Any) -> str:
        """The served model a chat naming `name` runs on (None: the default); 409 `model_not_served` naming the
        served ones when it names another: the chat keeps its history, and goes on once its model is changed."""
        assert self.models is not None
        if name is None or name == self.models.default_name:
            return self.models.default_name
        if name not in self.models.names:
            served = ", ".join(repr(n) for n in self.models.names)
            raise APIError(
                409,
                f"this chat runs on model {str(name)[:200]!r}, which this server no longer serves; pick one of "
                f"{served} in the chat's model picker (the history stays as it is)",
                param="settings.model",
                code="model_not_served",
            )
        return name

    def loaded_model(self, name: Any) -> ChatModel:
        """The chat model `name` if it is loaded and has served a turn here, else the default's."""
        model = self._chat_models.get(name) if isinstance(name, str) else None
        if model is None or self.models is None:
            return self.default_model
        loaded = {h.name: h.engine for h in self.models.loaded()}
        return model if loaded.get(model.name) is model.engine else self.default_model

    async def _chat_model(self, handle: ModelHandle) -> ChatModel:
        """`handle`'s chat model: the default's, or one made (and kept while its engine is the same) for another."""
        assert self.models is not None
        if handle.name == self.models.default_name:
            return self.default_model
        known = self._chat_models.get(handle.name)
        if known is not None and known.engine is handle.engine:
            return known
        model = await make_chat_model(handle, self.store, self.settings)
        self._chat_models[handle.name] = model
        loaded = {h.engine for h in self.models.loaded()}
        for name in [n for n, m in self._chat_models.items() if m.engine not in loaded]:
            del self._chat_models[name]  # an unloaded model's tokenizer copies go with it
        return model

    async def _drive(self, reply: Reply, plan: PromptPlan, place: ReplyPlace, writer: ReplyWriter) -> None:
        try:
            await writer.run(reply, plan, place)
        finally:
            self._turns.pop(reply.session_id, None)


async def make_chat_model(handle: ModelHandle, store: Store, settings: Settings) -> ChatModel:
    """A loaded model as the chat uses it: its template's end-of-turn ids and its tokenizer's fingerprint (read on
    the tokenizer thread), a conversation builder to its context, and a reply writer under that fingerprint."""
    engine = handle.engine
    end_of_turn = await engine.tokenize(template_end_of_turn_ids)
    fingerprint = await engine.tokenize(tokenizer_fingerprint)
    builder = ConversationBuilder(engine.tokenizer, handle.info.max_model_len, end_of_turn)
    writer = ReplyWriter(store, fingerprint, settings.flush_interval_s, settings.store_retry_s)
    return ChatModel(
        handle.name, engine, builder, fingerprint, handle.public_prefixes, handle.sampling_defaults, writer
    )


def chat_of(svc: Services) -> ChatService:
    """The app's chat service (`Services.chat`, typed for the shared layers by what they need of it)."""
    chat = svc.chat
    assert isinstance(chat, ChatService), "the lifespan builds Services.chat as a ChatService"
    return chat

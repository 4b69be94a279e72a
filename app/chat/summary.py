"""The third choice when a chat outgrows the context (app/chat/truncation.py): a new chat that starts from a summary.

The model writes the summary in a one-off request: the chat's history that fits (the oldest exchanges left out
first, as "drop the oldest turns" would) followed by a user turn asking for a summary. The new chat follows the same
preset and settings, and its system prompt is the old one with the summary after it; nothing of the old chat
changes. The page then sends the message that did not fit into the new chat.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from app.chat.branches import ReplyMode, locate
from app.chat.chat_settings import effective_settings, effective_system_prompt
from app.chat.conversation import turns_from_messages
from app.chat.service import ChatService
from app.chat.truncation import Truncate
from app.db import Parent, SessionRecord
from app.engine_client.request_label import chat_label
from app.http.errors import APIError, bad_request
from app.http.limits import Lease

SUMMARY_REQUEST = (
    "Summarize our conversation so far for a new chat that will continue it: the facts, documents, decisions and "
    "open questions that matter, in a few short paragraphs. Write only the summary."
)
SUMMARY_HEADING = "Summary of an earlier conversation (the chat it continues):"
MAX_TITLE_CHARS = 200


@dataclass(frozen=True)
class Summary:
    """The new chat and what it starts from."""

    session: SessionRecord
    text: str
    truncated_turns: int  # exchanges of the old chat the summary could not read (they did not fit either)


async def summarize_into_new_chat(
    chat: ChatService, owner: str, session_id: str, lease: Lease | None = None
) -> Summary:
    """Summarize the branch on show of `session_id` into a new chat of the same owner; 409 while a reply streams."""
    try:
        return await _summarize(chat, owner, session_id)
    finally:
        if lease is not None:
            lease.release()


async def _summarize(chat: ChatService, owner: str, session_id: str) -> Summary:
    store = chat.store
    session, tree, preset = await chat.load_chat(owner, session_id)
    if chat.is_streaming(session_id):
        raise APIError(
            409,
            "a reply is still streaming in this session: summarize it once it has ended",
            code="reply_in_progress",
        )
    history = locate(ReplyMode.SEND, tree, Parent.ACTIVE_LEAF).history
    if not history:
        raise bad_request("this chat has no messages to summarize", "session_id")
    settings = effective_settings(session, preset)
    async with chat.model_of(settings) as model:  # the chat's own model summarizes it
        params, max_tokens = chat.sampling(settings, model)
        params = dataclasses.replace(params, report_progress=False)
        turns = turns_from_messages(history, model.fingerprint)
        system_prompt = effective_system_prompt(session, preset, chat.settings.default_system_prompt)
        plan = await model.engine.tokenize(
            lambda _tok: model.builder.build_prompt(
                system_prompt, turns, SUMMARY_REQUEST, max_tokens, Truncate.OLDEST
            )
        )
        request_id = "summary-" + uuid.uuid4().hex
        stream = await model.engine.add_request(
            request_id,
            plan.token_ids,
            params,
            cache_salt=owner if chat.settings.prefix_cache_isolation else None,
            label=chat_label(session.title, owner),
            session=session_id,
        )
    text = ""
    async with stream:  # leaving early (the client went away) aborts it: its blocks go back
        async for output in stream:
            text += output.outputs[0].text_delta
    text = text.strip()
    if not text:
        raise APIError(
            500,
            "the model wrote an empty summary: try again, or drop the oldest turns instead",
            code="empty_summary",
        )
    # the prompt the old chat had (its own, its preset's or the server's), then the summary
    head = system_prompt.strip()
    new_prompt = (head + "\n\n" if head else "") + SUMMARY_HEADING + "\n" + text
    title = ("Continued: " + (session.title or "chat"))[:MAX_TITLE_CHARS]
    created = await store.chats.create_session(
        owner, title=title, system_prompt=new_prompt, settings=session.settings, preset_id=session.preset_id
    )
    return Summary(created, text, plan.truncated_turns)

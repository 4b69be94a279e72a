"""Messages and token usage as the API shows them: one shape for stored messages, `done` events and /v1 replies."""

from __future__ import annotations

from typing import Any, Protocol

from app.db import AttachmentRecord, MessageRecord


class MessageView(Protocol):
    """The fields a message shows: a stored MessageRecord has them, and so does a reply's FinalReply."""

    @property
    def id(self) -> int | None: ...
    @property
    def parent_id(self) -> int | None: ...
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def cached_tokens(self) -> int | None: ...
    @property
    def truncated_turns(self) -> int | None: ...
    @property
    def timings(self) -> dict[str, float] | None: ...
    @property
    def error(self) -> str | None: ...


def message_fields(m: MessageView) -> dict[str, Any]:
    """A message as the API shows it, without `created_at` (token ids left out: they are the server's business)."""
    return {
        "id": m.id,
        "parent_id": m.parent_id,
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
    }


def attachment_json(a: AttachmentRecord) -> dict[str, Any]:
    """An attached file as the API shows it beside its message (its text only on request: GET …/attachments/{id})."""
    return {
        "id": a.id,
        "message_id": a.message_id,
        "filename": a.filename,
        "media_type": a.media_type,
        "bytes": a.num_bytes,
        "tokens": a.num_tokens,
        "created_at": a.created_at.isoformat(),
    }


def message_json(m: MessageRecord) -> dict[str, Any]:
    """A stored message as the API shows it, with its attached files."""
    return {
        **message_fields(m),
        "attachments": [attachment_json(a) for a in m.attachments],
        "created_at": m.created_at.isoformat(),
    }


def usage_json(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    draft_tokens: int = 0,
    accepted_tokens: int = 0,
) -> dict[str, Any]:
    """`usage` with `prompt_tokens_details.cached_tokens` (prompt tokens served from the prefix cache) and, in
    OpenAI's fields of predicted outputs, how many of the tokens speculative decoding proposed were kept
    (`completion_tokens_details.accepted_prediction_tokens`) and how many were not (`rejected_prediction_tokens`)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted_tokens,
            "rejected_prediction_tokens": draft_tokens - accepted_tokens,
        },
    }

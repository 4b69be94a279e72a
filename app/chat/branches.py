"""Which branch a turn extends: the modes of a reply, the message a turn names, and where in the tree it forks.

A turn names a message (`parent_id` for a new message, `message_id` for the others) or leaves it to the session's
active leaf. SEND adds a user message after a reply (or as a new first message); EDIT adds a sibling of any user
message (a new branch there); REGENERATE adds a sibling reply to a user message; CONTINUE extends a reply that
stopped at its token limit, in place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from app.db import MessageRecord, MessageStatus, MessageTree, Parent
from app.http.errors import bad_request
from app.http.messages import message_json
from engine.core.sequence import FinishReason


class ReplyMode(str, Enum):
    """How a turn's reply starts: after a new user message, beside a reply, after an edited message, or continuing
    a reply."""

    SEND = "send"
    REGENERATE = "regenerate"
    EDIT = "edit"
    CONTINUE = "continue"

    def __str__(self) -> str:
        return self.value


# the field of a request or frame that names the turn's message
TARGET_FIELDS = {
    ReplyMode.SEND: "parent_id",
    ReplyMode.REGENERATE: "message_id",
    ReplyMode.EDIT: "message_id",
    ReplyMode.CONTINUE: "message_id",
}
Target = int | None | Parent


@dataclass(frozen=True)
class Fork:
    """Where a turn goes: the history before its user turn, that user message (None: a new one is stored after
    `user_parent_id`), and the reply it continues (CONTINUE only)."""

    history: list[MessageRecord]
    user: MessageRecord | None
    user_parent_id: int | None
    continued: MessageRecord | None = None
    edited: MessageRecord | None = None  # EDIT: the user message the new one is a version of


def message_id_value(fields: dict[str, Any], key: str, *, nullable: bool = False) -> int | None:
    """A message id field: a positive integer (or null where `nullable`); 400 otherwise."""
    value = fields.get(key)
    if value is None and nullable:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    what = "a message id (a positive integer)" + (" or null (a new first message)" if nullable else "")
    raise bad_request(f"{key} must be {what}, got {json.dumps(value)[:40]}", key)


def turn_target(mode: ReplyMode, fields: dict[str, Any]) -> Target:
    """The message a request or frame names for its turn; Parent.ACTIVE_LEAF when it names none."""
    key = TARGET_FIELDS[mode]
    if key not in fields:
        return Parent.ACTIVE_LEAF
    return message_id_value(fields, key, nullable=mode is ReplyMode.SEND)


def locate(mode: ReplyMode, tree: MessageTree, target: Target) -> Fork:
    """Where the turn forks; 400 naming the field when the message it names cannot take it."""
    key = TARGET_FIELDS[mode]
    named = tree.leaf_id if target is Parent.ACTIVE_LEAF else target
    if named is not None and named not in tree:
        raise bad_request(f"{key} {named} is not a message of this session", key)
    if mode is ReplyMode.SEND:
        if target is not Parent.ACTIVE_LEAF and named is not None and tree.get(named).role == "user":
            raise bad_request(
                f"parent_id {named} is a user message: a new message follows a reply (edit changes a message)",
                key,
            )
        return Fork(tree.path_to(named), None, named)
    if mode is ReplyMode.EDIT:
        edited = tree.last_user_on_path() if target is Parent.ACTIVE_LEAF else tree.get(named)  # type: ignore[arg-type]
        if edited is None:
            raise bad_request("nothing to edit: the session has no user message yet", "session")
        if edited.role != "user":
            raise bad_request(f"message_id {edited.id} is a reply: edit takes a user message", key)
        return Fork(tree.path_to(edited.parent_id), None, edited.parent_id, edited=edited)
    if named is None:
        raise bad_request(f"nothing to {mode}: the session has no user message yet", "session")
    message = tree.get(named)
    user = message if message.role == "user" else _user_before(tree, message)
    if user is None:
        raise bad_request(f"nothing to {mode}: message {named} follows no user message", key)
    if mode is ReplyMode.REGENERATE:
        return Fork(tree.path_to(user.parent_id), user, user.parent_id)
    if message.role != "assistant":
        raise bad_request(f"message_id {named} is a user message: continue takes a reply", key)
    if message.status != MessageStatus.FINISHED or message.finish_reason != FinishReason.LENGTH.value:
        raise bad_request(
            f"message {named} did not stop at its token limit (status {message.status}, finish_reason "
            f"{message.finish_reason}): only such a reply can be continued",
            key,
        )
    if tree.child_ids(named):
        raise bad_request(
            f"message {named} has messages after it: continue extends the last reply of a branch", key
        )
    return Fork(tree.path_to(user.parent_id), user, user.parent_id, message)


def _user_before(tree: MessageTree, message: MessageRecord) -> MessageRecord | None:
    parent = tree.get(message.parent_id) if message.parent_id is not None else None
    return parent if parent is not None and parent.role == "user" else None


def path_json(tree: MessageTree) -> dict[str, Any]:
    """The branch on show as the API returns it: `active_leaf_id`, and `messages` from the first to the leaf, each
    with the ids of its versions (`sibling_ids`, itself included, oldest first) and its place among them."""
    messages = [with_siblings(m, tree.sibling_ids(m.id)) for m in tree.active_path()]
    return {"active_leaf_id": tree.leaf_id, "messages": messages}


def with_siblings(message: MessageRecord, sibling_ids: tuple[int, ...]) -> dict[str, Any]:
    """A message as the API shows it, with the ids of its versions (itself included) and its index among them."""
    return {
        **message_json(message),
        "sibling_ids": list(sibling_ids),
        "sibling_index": sibling_ids.index(message.id),
    }

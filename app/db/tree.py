"""A session's messages as a tree of branches: paths, siblings and the active leaf, computed from records (no SQL).

A message's parent is the turn it follows; siblings (the same parent) are the versions of one turn: regenerated
replies, edited user messages. Siblings are ordered by creation. The active path runs from a first message down to
the session's active leaf: the branch on show, which a new turn extends unless it names another parent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from app.db.records import MessageRecord


class Parent(Enum):
    """Where a new message goes when its caller names no parent: after the session's active leaf."""

    ACTIVE_LEAF = "active_leaf"


@dataclass(frozen=True)
class MessageTree:
    """Every message of one session (creation order) and its active leaf."""

    messages: tuple[MessageRecord, ...]
    active_leaf_id: int | None  # as stored: it may be None or stale; `leaf_id` is what readers use
    _by_id: dict[int, MessageRecord] = field(init=False, repr=False, compare=False)
    _children: dict[int | None, list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {m.id: m for m in self.messages}
        children: dict[int | None, list[int]] = {}
        for m in sorted(self.messages, key=lambda m: m.position):
            children.setdefault(m.parent_id, []).append(m.id)
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_children", children)

    @classmethod
    def of(cls, messages: Iterable[MessageRecord], active_leaf_id: int | None) -> MessageTree:
        """A tree of these records (any order)."""
        return cls(tuple(sorted(messages, key=lambda m: m.position)), active_leaf_id)

    @property
    def leaf_id(self) -> int | None:
        """The end of the active path: the stored active leaf, else the newest message (None when empty)."""
        if self.active_leaf_id in self._by_id:
            return self.active_leaf_id
        return self.messages[-1].id if self.messages else None

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._by_id

    def get(self, message_id: int) -> MessageRecord:
        """The message (KeyError when it is not in this session)."""
        return self._by_id[message_id]

    def child_ids(self, parent_id: int | None) -> tuple[int, ...]:
        """The messages that follow `parent_id` (None: the first messages), oldest first."""
        return tuple(self._children.get(parent_id, ()))

    def sibling_ids(self, message_id: int) -> tuple[int, ...]:
        """The versions of this message's turn, itself included, oldest first."""
        return self.child_ids(self._by_id[message_id].parent_id)

    def path_to(self, message_id: int | None) -> list[MessageRecord]:
        """The messages from a first message down to `message_id` (empty for None)."""
        path: list[MessageRecord] = []
        node = message_id
        while node is not None:
            message = self._by_id[node]
            path.append(message)
            node = message.parent_id
        path.reverse()
        return path

    def active_path(self) -> list[MessageRecord]:
        """The branch on show."""
        return self.path_to(self.leaf_id)

    def newest_under(self, message_id: int) -> int:
        """The newest message of the branches below `message_id` (itself when it has none): switching to a version
        shows its latest continuation. The newest descendant is always a leaf (children come after parents)."""
        newest = self._by_id[message_id]
        stack = [message_id]
        while stack:
            for child in self._children.get(stack.pop(), ()):
                if self._by_id[child].position > newest.position:
                    newest = self._by_id[child]
                stack.append(child)
        return newest.id

    def last_user_on_path(self) -> MessageRecord | None:
        """The last user message of the active path."""
        return next((m for m in reversed(self.active_path()) if m.role == "user"), None)

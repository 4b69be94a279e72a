"""What each owner keeps (sessions, messages, bytes of text), as a running figure: counted once from the database,
then moved by the store's own writes, so a quota check costs a dict lookup instead of reading all the owner's text.

Every write notes its change in its transaction (`note`, or `forget` where the change is not at hand: deletions); the
notes reach the figures only once the transaction commits, so a rolled-back write leaves them as they were. A figure
older than STALE_AFTER_S is counted again (writes made by another process reach the figures that way). All calls run
on the store's one worker thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Integer, LargeBinary, cast, func, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from app.db.models import ChatSession, Message, SystemPromptChange

STALE_AFTER_S = 60.0
MAX_OWNERS = 100_000  # least recently used figures are dropped past this (they are counted again when needed)
_LEDGER = "pagedchat_usage_ledger"  # keys of Session.info
_PENDING = "pagedchat_usage_pending"
_FORGET = "forget"


@dataclass(frozen=True)
class OwnerUsage:
    """What one owner keeps: sessions, messages, and UTF-8 bytes of titles, system prompts (replaced ones too) and
    message text."""

    num_sessions: int = 0
    num_messages: int = 0
    num_bytes: int = 0

    def __add__(self, other: OwnerUsage) -> OwnerUsage:
        return OwnerUsage(
            self.num_sessions + other.num_sessions,
            self.num_messages + other.num_messages,
            self.num_bytes + other.num_bytes,
        )


def text_bytes(*values: str | None) -> int:
    """UTF-8 bytes of the given strings (None counts 0), as the quota counts them."""
    return sum(len(v.encode("utf-8", "surrogatepass")) for v in values if v)


class utf8_length(FunctionElement[int]):  # noqa: N801 (an SQL function's name)
    """A text's length in UTF-8 bytes: length(CAST(x AS BLOB)) on SQLite, octet_length(x) on PostgreSQL (whose cast
    of text to bytea would read backslashes in the text as escapes)."""

    type = Integer()
    inherit_cache = True
    name = "utf8_length"


@compiles(utf8_length)
def _utf8_length_as_blob(element: utf8_length, compiler: SQLCompiler, **kw: object) -> str:
    (value,) = element.clauses
    return compiler.process(func.length(cast(value, LargeBinary)), **kw)


@compiles(utf8_length, "postgresql")
def _utf8_length_octets(element: utf8_length, compiler: SQLCompiler, **kw: object) -> str:
    return f"octet_length({compiler.process(element.clauses, **kw)})"


def nbytes(column: InstrumentedAttribute[str]) -> ColumnElement[int]:
    """The column's UTF-8 length in bytes, as SQL."""
    return func.coalesce(utf8_length(column), 0)


def owner_usage(s: Session, owner: str) -> OwnerUsage:
    """Count the owner's sessions, messages and bytes from the database (reads all its text)."""
    sessions = select(
        func.count(),
        func.coalesce(func.sum(nbytes(ChatSession.title) + nbytes(ChatSession.system_prompt)), 0),
    ).where(ChatSession.owner == owner)
    messages = (
        select(func.count(Message.id), func.coalesce(func.sum(nbytes(Message.content)), 0))
        .join(ChatSession, Message.session_id == ChatSession.id)
        .where(ChatSession.owner == owner)
    )
    prompt_changes = (
        select(func.coalesce(func.sum(nbytes(SystemPromptChange.previous)), 0))
        .join(ChatSession, SystemPromptChange.session_id == ChatSession.id)
        .where(ChatSession.owner == owner)
    )
    num_sessions, session_bytes = s.execute(sessions).one()
    num_messages, message_bytes = s.execute(messages).one()
    change_bytes = s.execute(prompt_changes).scalar_one()
    return OwnerUsage(
        int(num_sessions), int(num_messages), int(session_bytes) + int(message_bytes) + int(change_bytes)
    )


class UsageLedger:
    """The running figures of every owner seen lately; see the module doc."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._known: OrderedDict[str, tuple[float, OwnerUsage]] = (
            OrderedDict()
        )  # owner -> (counted at, usage)

    def begin(self, s: Session) -> None:
        """Attach the ledger to a transaction about to run."""
        s.info[_LEDGER] = self
        s.info[
            _PENDING
        ] = {}  # owner -> (base, delta): base None (the known figure), _FORGET or a fresh count

    def commit(self, s: Session) -> None:
        """Apply a committed transaction's notes."""
        now = self._clock()
        for owner, (base, delta) in s.info.pop(_PENDING, {}).items():
            known = self._known.pop(owner, None)
            if base == _FORGET:
                continue
            if base is None:
                if known is not None:
                    self._known[owner] = (known[0], known[1] + delta)
            else:
                self._known[owner] = (now, base + delta)
        while len(self._known) > MAX_OWNERS:
            self._known.popitem(last=False)

    def current(self, s: Session, owner: str) -> OwnerUsage:
        """The owner's usage as this transaction sees it."""
        pending = s.info[_PENDING]
        base, delta = pending.get(owner, (None, OwnerUsage()))
        known = self._known.get(owner)
        if base is None and known is not None and self._clock() - known[0] <= STALE_AFTER_S:
            self._known.move_to_end(owner)
            return known[1] + delta
        if base is None or base == _FORGET:
            counted = owner_usage(s, owner)  # includes this transaction's own writes so far
            pending[owner] = (counted, OwnerUsage())
            return counted
        return base + delta


def note(s: Session, owner: str, *, sessions: int = 0, messages: int = 0, nbytes: int = 0) -> None:
    """Record that this transaction changed the owner's usage by this much (no-op without a ledger)."""
    pending = s.info.get(_PENDING)
    if pending is None:
        return
    base, delta = pending.get(owner, (None, OwnerUsage()))
    pending[owner] = (base, delta + OwnerUsage(sessions, messages, nbytes))


def forget(s: Session, owner: str) -> None:
    """Record that this transaction changed the owner's usage by an amount not at hand: count it again."""
    pending = s.info.get(_PENDING)
    if pending is not None:
        pending[owner] = (_FORGET, OwnerUsage())


def tracking(s: Session) -> bool:
    """Whether a ledger follows this transaction (writes then note what they change)."""
    return _PENDING in s.info


def usage_of(s: Session, owner: str) -> OwnerUsage:
    """The owner's usage: the ledger's figure when one follows the transaction, else counted from the database."""
    ledger = s.info.get(_LEDGER)
    return ledger.current(s, owner) if ledger is not None else owner_usage(s, owner)

"""A chat's system prompt changes after its turns are kept (what each replaced, and when); changes with no turn
between them are one change; none is kept before the first turn; their text counts against the owner's quota."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from app.db import Store
from app.db.usage import owner_usage, usage_of
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio
ALICE = "browser:alice"


@pytest.fixture
async def store(make_db: Callable[..., TestDatabase]) -> AsyncIterator[Store]:
    s = Store(make_db().url)
    await s.start()
    yield s
    await s.close()


async def turn(store: Store, sid: str, text: str) -> None:
    await store.chats.add_message(sid, "user", text)
    await store.chats.add_message(sid, "assistant", "answer to " + text, status="finished")


async def test_changes_after_turns_are_kept_in_order(store: Store) -> None:
    sid = (await store.chats.create_session(ALICE, system_prompt="A")).id
    await store.chats.update_session(ALICE, sid, system_prompt="B")  # before any turn: nothing to tell
    assert await store.chats.prompt_changes(ALICE, sid) == []
    await turn(store, sid, "one")
    await store.chats.update_session(ALICE, sid, system_prompt="C")
    await store.chats.update_session(ALICE, sid, system_prompt="D")  # no turn between: the same change
    [change] = await store.chats.prompt_changes(ALICE, sid)
    assert (change.previous, change.system_prompt) == ("B", "D")
    messages = await store.chats.list_messages(ALICE, sid)
    assert change.changed_at >= messages[-1].created_at
    await turn(store, sid, "two")
    await store.chats.update_session(ALICE, sid, system_prompt="")
    await store.chats.update_session(ALICE, sid, title="renamed")  # no system prompt given: no change
    changes = await store.chats.prompt_changes(ALICE, sid)
    assert [(c.previous, c.system_prompt) for c in changes] == [("B", "D"), ("D", "")]
    await store.chats.update_session(ALICE, sid, system_prompt="D")  # changed back before any turn: gone
    assert [(c.previous, c.system_prompt) for c in await store.chats.prompt_changes(ALICE, sid)] == [
        ("B", "D")
    ]
    assert await store.chats.prompt_changes("browser:bob", sid) is None  # another owner's chat is missing
    assert await store.write(usage_of, ALICE) == await store.write(owner_usage, ALICE)
    assert (await store.write(owner_usage, ALICE)).num_bytes == len("renamed" + "D" + "B") + sum(
        len(m.content) for m in await store.chats.list_messages(ALICE, sid)
    )
    assert await store.chats.delete_session(ALICE, sid)  # the changes go with the chat
    assert (await store.write(owner_usage, ALICE)).num_bytes == 0

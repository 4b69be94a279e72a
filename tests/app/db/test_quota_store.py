"""Storage quotas in the store: per-owner sessions, messages and bytes, the database size guard, exact refusals,
and the running per-owner figures checked against the database."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy import delete

from app.db import QuotaExceeded, StorageQuota, Store
from app.db.models import ChatSession
from app.db.usage import STALE_AFTER_S, UsageLedger, owner_usage, usage_of
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio
ALICE, BOB = "browser:alice", "browser:bob"


@pytest.fixture
async def make_store(make_db: Callable[..., TestDatabase]) -> AsyncIterator[Callable[..., Store]]:
    """Start stores on fresh databases of the test's backend with the given quota; all are closed afterwards."""
    stores: list[Store] = []

    async def make(**limits: int) -> Store:
        store = Store(make_db().url, quota=StorageQuota(**limits))
        await store.start()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


async def test_the_session_past_the_limit_is_refused_and_nothing_is_stored(make_store) -> None:
    store = await make_store(max_sessions=3)
    for _ in range(3):
        await store.chats.create_session(ALICE)
    with pytest.raises(QuotaExceeded) as refused:
        await store.chats.create_session(ALICE, title="one too many")
    assert (refused.value.limit_name, refused.value.limit, refused.value.database) == (
        "max_sessions_per_owner",
        3,
        False,
    )
    assert "you keep 3 sessions and this needs 1 more, over the limit of 3 sessions" in str(refused.value)
    assert [s.title for s in await store.chats.list_sessions(ALICE)] == ["New chat"] * 3
    await store.chats.create_session(BOB)  # another owner has room of its own
    await store.chats.delete_session(ALICE, (await store.chats.list_sessions(ALICE))[0].id)
    await store.chats.create_session(ALICE)  # deleting makes room


async def test_a_user_message_needs_room_for_itself_and_its_reply(make_store) -> None:
    store = await make_store(max_messages=5)
    sid = (await store.chats.create_session(ALICE)).id
    for content in ("one", "two"):
        await store.chats.add_message(sid, "user", content)
        await store.chats.add_message(sid, "assistant", "answer", status="finished")
    with pytest.raises(QuotaExceeded) as refused:  # 4 kept + the message and its reply = 6 > 5
        await store.chats.add_message(sid, "user", "three")
    assert refused.value.limit_name == "max_messages_per_owner"
    assert len(await store.chats.list_messages(ALICE, sid)) == 4
    # the limit counts every session of the owner
    other = (await store.chats.create_session(ALICE)).id
    with pytest.raises(QuotaExceeded):
        await store.chats.add_message(other, "user", "elsewhere")


async def test_bytes_count_utf8_of_titles_prompts_and_messages(make_store) -> None:
    store = await make_store(max_bytes=100)
    sid = (
        await store.chats.create_session(ALICE, title="é" * 10, system_prompt="x" * 40)
    ).id  # 20 + 40 bytes
    await store.chats.add_message(sid, "user", "y" * 20)
    await store.chats.add_message(
        sid, "assistant", "z" * 10, status="finished"
    )  # replies are stored, never refused
    with pytest.raises(QuotaExceeded) as refused:  # 90 kept + 11 = 101 > 100
        await store.chats.add_message(sid, "user", "w" * 11)
    assert refused.value.limit_name == "max_bytes_per_owner"
    assert "you keep 90 bytes of text and this needs 11 more, over the limit of 100" in str(refused.value)
    await store.chats.add_message(sid, "user", "w" * 10)  # exactly at the limit
    with pytest.raises(QuotaExceeded):  # a longer system prompt does not fit either
        await store.chats.update_session(ALICE, sid, system_prompt="x" * 41)
    shorter = await store.chats.update_session(
        ALICE, sid, title="short", system_prompt=""
    )  # shrinking always may
    assert shorter is not None and shorter.title == "short"


async def test_a_refused_edit_leaves_the_conversation_as_it_was(make_store) -> None:
    store = await make_store(max_bytes=30)
    sid = (await store.chats.create_session(ALICE, title="")).id
    first = await store.chats.add_message(sid, "user", "a" * 10)
    await store.chats.add_message(sid, "assistant", "b" * 10, status="finished")
    with pytest.raises(QuotaExceeded):  # an edit is a new branch: the old one keeps its bytes (20 + 11 > 30)
        await store.chats.add_message(sid, "user", "c" * 11, parent_id=first.parent_id)
    assert [m.content for m in await store.chats.list_messages(ALICE, sid)] == ["a" * 10, "b" * 10]
    edited = await store.chats.add_message(sid, "user", "c" * 10, parent_id=first.parent_id)
    assert [m.content for m in await store.chats.list_messages(ALICE, sid)] == ["c" * 10]
    tree = await store.chats.get_tree(ALICE, sid)
    assert tree is not None and tree.sibling_ids(edited.id) == (first.id, edited.id)


async def test_the_database_guard_refuses_new_data_with_its_value(make_store, db_backend: str) -> None:
    store = await make_store()
    used = await store.database_bytes()
    page_size = 4096 if db_backend == "sqlite" else 8192  # SQLite's pages, PostgreSQL's blocks
    assert used is not None and used > 0 and used % page_size == 0
    full = await make_store(max_database_bytes=used)
    sid = None
    with pytest.raises(QuotaExceeded) as refused:
        sid = (await full.chats.create_session(ALICE)).id
    assert sid is None
    assert (refused.value.database, refused.value.limit_name) == (True, "max_database_bytes")
    assert f"at its limit of {used} bytes (max_database_bytes)" in str(refused.value)
    assert await full.chats.list_sessions(ALICE) == []


async def test_unlimited_by_default(make_store) -> None:
    store = await make_store()
    sid = (await store.chats.create_session(ALICE, system_prompt="x" * 100_000)).id
    for _ in range(3):
        await store.chats.add_message(sid, "user", "y" * 100_000)
    assert len(await store.chats.list_messages(ALICE, sid)) == 3


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes must be non-negative"):
        StorageQuota(max_bytes=-1)


async def test_the_running_figures_match_the_database_through_every_kind_of_write(make_store) -> None:
    """Random writes of three owners (attached files too), refusals (rolled back) included: after each, figure ==
    count from the database."""
    store = await make_store(max_sessions=4, max_messages=8, max_bytes=1000)
    rng = random.Random(7)
    owners = [ALICE, BOB, "key:carol"]
    refused = compared = 0

    async def some_session(owner: str) -> str | None:
        sessions = await store.chats.list_sessions(owner)
        return rng.choice(sessions).id if sessions else None

    for step in range(300):
        owner = rng.choice(owners)
        sid = await some_session(owner)
        actions = ["create", "rename", "delete", "turn", "edit", "truncate", "attach"]
        action = rng.choice(actions if sid else ["create"])
        text = "é" * rng.randint(0, 40) + "x" * rng.randint(0, 300)
        try:
            if action == "create":
                await store.chats.create_session(owner, title=text[:50], system_prompt=text)
            elif action == "rename":
                await store.chats.update_session(
                    owner, sid, title=text[:20], system_prompt=text[: rng.randint(0, 300)]
                )
            elif action == "delete":
                await store.chats.delete_session(owner, sid)
            elif action == "turn":
                await store.chats.add_message(sid, "user", text)
                reply = await store.chats.start_assistant(
                    sid, prompt_tokens=1, cached_tokens=0, truncated_turns=0, tokenizer_fingerprint="t"
                )
                await store.chats.flush_assistant(reply.id, text[:10])
                if rng.random() < 0.7:
                    await finish(store, reply.id, text[: rng.randint(0, 200)])
            else:
                users = [m for m in await store.chats.list_messages(owner, sid) if m.role == "user"]
                if users and action == "edit":  # the edited message's files are copied to the new version
                    files_of = users[-1].id if users[-1].attachments else None
                    await store.chats.add_message(
                        sid, "user", text, parent_id=users[-1].parent_id, attachments_of=files_of
                    )
                elif action == "attach":  # a file waits, then is removed or sent with a message
                    attachment = await store.chats.add_attachment(
                        owner,
                        sid,
                        filename="f-" + text[:8],
                        media_type="text/plain",
                        num_bytes=1,
                        text=text,
                        num_tokens=1,
                    )
                    assert attachment is not None
                    if rng.random() < 0.4:
                        await store.chats.delete_attachment(owner, sid, attachment.id)
                    else:
                        await store.chats.add_message(sid, "user", "q", attachment_ids=[attachment.id])
                elif users:
                    await store.chats.delete_messages_from(sid, users[0].id)
        except QuotaExceeded:
            refused += 1
        for who in owners:
            compared += who in store._usage._known  # a running figure, not a fresh count
            figure = await store.write(usage_of, who)
            assert figure == await store.write(owner_usage, who), (step, action, who)
    assert refused >= 20 and compared >= 600, (refused, compared)  # the walk reached the limits, on figures


async def test_a_stale_figure_is_counted_again(make_store) -> None:
    store = await make_store(max_sessions=2)
    now = [0.0]
    store._usage = UsageLedger(clock=lambda: now[0])
    await store.chats.create_session(ALICE)
    await store.chats.create_session(ALICE)
    await store.write(
        lambda s: s.execute(delete(ChatSession))
    )  # another process's write: unseen by the figures
    with pytest.raises(QuotaExceeded):
        await store.chats.create_session(ALICE)
    now[0] = STALE_AFTER_S + 1
    await store.chats.create_session(ALICE)  # counted again: room


async def finish(store: Store, message_id: int, content: str) -> None:
    await store.chats.finish_assistant(
        message_id,
        content=content,
        status="finished",
        finish_reason="stop",
        token_ids=[1],
        completion_tokens=1,
        timings={},
    )

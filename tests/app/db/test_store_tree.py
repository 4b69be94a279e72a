"""Store: messages as a tree of branches (regenerated replies and edited messages are siblings), the active path,
switching branches, continuing a reply in place, and deleting a branch."""

from __future__ import annotations

import pytest

from app.db import MessageTree, Parent, Store
from tests.app.db.test_store import finish

pytestmark = pytest.mark.anyio


async def reply(store: Store, sid: str, text: str, parent_id: int | Parent = Parent.ACTIVE_LEAF) -> int:
    row = await store.chats.start_assistant(
        sid,
        prompt_tokens=5,
        cached_tokens=0,
        truncated_turns=0,
        tokenizer_fingerprint="f",
        parent_id=parent_id,
    )
    await finish(store, row.id, text, [7, 8])
    return row.id


async def tree_of(store: Store, sid: str) -> MessageTree:
    tree = await store.chats.get_tree("alice", sid)
    assert tree is not None
    return tree


def contents(path: list) -> list[str]:
    return [m.content for m in path]


async def test_a_linear_history_is_a_chain_whose_last_message_is_active(store: Store) -> None:
    sid = (await store.chats.create_session("alice")).id
    assert (await tree_of(store, sid)).leaf_id is None
    u1 = await store.chats.add_message(sid, "user", "one")
    a1 = await reply(store, sid, "first answer")
    u2 = await store.chats.add_message(sid, "user", "two")
    tree = await tree_of(store, sid)
    assert [(m.id, m.parent_id) for m in tree.messages] == [(u1.id, None), (a1, u1.id), (u2.id, a1)]
    assert tree.active_leaf_id == u2.id and contents(tree.active_path()) == ["one", "first answer", "two"]
    assert [tree.sibling_ids(m.id) for m in tree.messages] == [(u1.id,), (a1,), (u2.id,)]
    assert contents(await store.chats.list_messages("alice", sid)) == ["one", "first answer", "two"]


async def test_regenerate_and_edit_add_siblings_and_switching_shows_each_branch(store: Store) -> None:
    sid = (await store.chats.create_session("alice")).id
    u1 = await store.chats.add_message(sid, "user", "one")
    a1 = await reply(store, sid, "answer A")
    u2 = await store.chats.add_message(sid, "user", "two")
    a2 = await reply(store, sid, "two: A")
    a1b = await reply(store, sid, "answer B", parent_id=u1.id)  # regenerate the first reply
    tree = await tree_of(store, sid)
    assert tree.sibling_ids(a1) == tree.sibling_ids(a1b) == (a1, a1b)
    assert contents(tree.active_path()) == ["one", "answer B"]  # the new reply is on show
    u1b = await store.chats.add_message(sid, "user", "one, edited", parent_id=None)  # edit the first message
    a1c = await reply(store, sid, "answer C")
    tree = await tree_of(store, sid)
    assert tree.sibling_ids(u1.id) == (u1.id, u1b.id) and tree.child_ids(u1b.id) == (a1c,)
    assert contents(tree.active_path()) == ["one, edited", "answer C"]

    switched = await store.chats.switch_branch(
        "alice", sid, u1.id
    )  # back to the first version of message one
    assert switched is not None and switched.leaf_id == a1b  # its newest continuation
    assert contents(switched.active_path()) == ["one", "answer B"]
    assert (await tree_of(store, sid)).leaf_id == a1b  # stored: a reload (or another device) shows the same
    switched = await store.chats.switch_branch("alice", sid, a1)
    assert contents(switched.active_path()) == ["one", "answer A", "two", "two: A"]
    assert switched.leaf_id == a2
    # a new turn with no parent named extends the branch on show
    u3 = await store.chats.add_message(sid, "user", "three")
    assert u3.parent_id == a2 and (await tree_of(store, sid)).leaf_id == u3.id
    assert (await tree_of(store, sid)).sibling_ids(u2.id) == (u2.id,)


async def test_switching_checks_owner_and_message(store: Store) -> None:
    sid = (await store.chats.create_session("alice")).id
    other = (await store.chats.create_session("alice")).id
    foreign = await store.chats.add_message(other, "user", "elsewhere")
    await store.chats.add_message(sid, "user", "here")
    assert await store.chats.switch_branch("mallory", sid, foreign.id) is None
    with pytest.raises(ValueError, match=f"message {foreign.id} is not a message of session"):
        await store.chats.switch_branch("alice", sid, foreign.id)
    with pytest.raises(ValueError, match=f"message {foreign.id} is not a message of session"):
        await store.chats.add_message(sid, "user", "x", parent_id=foreign.id)
    assert contents(await store.chats.list_messages("alice", sid)) == ["here"]


async def test_resuming_a_reply_grows_the_same_row(store: Store) -> None:
    sid = (await store.chats.create_session("alice")).id
    await store.chats.add_message(sid, "user", "one")
    a1 = await reply(store, sid, "cut off")
    u2 = await store.chats.add_message(sid, "user", "other branch", parent_id=None)
    resumed = await store.chats.resume_assistant(
        a1, prompt_tokens=9, cached_tokens=8, truncated_turns=0, tokenizer_fingerprint="f"
    )
    assert (resumed.id, resumed.status, resumed.content, resumed.prompt_tokens) == (
        a1,
        "streaming",
        "cut off",
        9,
    )
    assert (await tree_of(store, sid)).leaf_id == a1  # it is on show again
    await store.chats.flush_assistant(a1, "cut off and more")
    await finish(store, a1, "cut off and more, done", [7, 8, 9, 10])
    tree = await tree_of(store, sid)
    assert contents(tree.active_path()) == ["one", "cut off and more, done"]
    assert tree.get(a1).token_ids == (7, 8, 9, 10) and len(tree.messages) == 3 and u2.id in tree


async def test_deleting_a_branch_keeps_its_siblings_and_moves_the_active_leaf(store: Store) -> None:
    sid = (await store.chats.create_session("alice")).id
    u1 = await store.chats.add_message(sid, "user", "one")
    a1 = await reply(store, sid, "A")
    a1b = await reply(store, sid, "B", parent_id=u1.id)
    await store.chats.add_message(sid, "user", "after B")
    assert await store.chats.delete_messages_from(sid, a1b) == 2
    tree = await tree_of(store, sid)
    assert [m.id for m in tree.messages] == [u1.id, a1] and tree.leaf_id == a1
    assert await store.chats.delete_messages_from(sid, u1.id) == 2
    assert (await tree_of(store, sid)).leaf_id is None

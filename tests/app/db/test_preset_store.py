"""Presets in the store, on SQLite and PostgreSQL: listed by name without case, one default per owner (a partial
unique index), names unique per owner, chats that follow a preset let go of it when it is deleted."""

from __future__ import annotations

import pytest

from app.db import PresetNameTaken, PresetRef, Store
from tests.app.databases import TestDatabase

pytestmark = pytest.mark.anyio


async def test_one_default_per_owner_and_names_unique_per_owner(store: Store, db: TestDatabase) -> None:
    terse = await store.presets.create_preset("alice", "terse", system_prompt="Be brief.", is_default=True)
    long = await store.presets.create_preset("alice", "Long", settings={"temperature": 0.2})
    theirs = await store.presets.create_preset(
        "bob", "terse", is_default=True
    )  # names and defaults are per owner
    assert [(p.name, p.is_default) for p in await store.presets.list_presets("alice")] == [
        ("Long", False),
        ("terse", True),
    ]
    assert (long.settings, terse.system_prompt) == ({"temperature": 0.2}, "Be brief.")

    moved = await store.presets.update_preset(
        "alice", long.id, is_default=True
    )  # the default moves, in one write
    assert moved is not None and moved.is_default
    assert [(p.name, p.is_default) for p in await store.presets.list_presets("alice")] == [
        ("Long", True),
        ("terse", False),
    ]
    assert db.raw("SELECT owner, name FROM presets WHERE is_default ORDER BY owner") == [
        ("alice", "Long"),
        ("bob", "terse"),
    ]
    with pytest.raises(PresetNameTaken, match="you already have a preset named 'Long'"):
        await store.presets.update_preset("alice", terse.id, name="Long")
    with pytest.raises(PresetNameTaken):
        await store.presets.create_preset("alice", "terse")
    assert await store.presets.get_preset("alice", theirs.id) is None  # another owner's is missing
    assert await store.presets.update_preset("alice", theirs.id, name="mine") is None
    assert await store.presets.delete_preset("alice", theirs.id) is False


async def test_a_chat_follows_the_default_until_the_preset_is_deleted(store: Store) -> None:
    preset = await store.presets.create_preset("alice", "Terse", is_default=True)
    follows = await store.chats.create_session("alice", preset_id=PresetRef.OWNER_DEFAULT)
    plain = await store.chats.create_session("bob", preset_id=PresetRef.OWNER_DEFAULT)  # bob has no default
    assert (follows.preset_id, plain.preset_id) == (preset.id, None)
    with pytest.raises(ValueError, match="is not one of your presets"):
        await store.chats.create_session("bob", preset_id=preset.id)
    assert await store.presets.delete_preset("alice", preset.id) is True
    again = await store.chats.get_session("alice", follows.id)
    assert again is not None and again.preset_id is None

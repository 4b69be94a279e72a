"""Presets in the database, and how a chat names the preset it follows: one synchronous function of an ORM session
per operation, bound as `PresetStore`'s async methods (app/db/threads.py).

A preset is one owner's: every function takes the owner and treats another owner's preset as missing. At most one
preset per owner is its default (a partial unique index holds it; setting a new default clears the old one first).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.db.models import ChatSession, Preset, utcnow
from app.db.quota import QuotaExceeded, check_room, quota_of
from app.db.records import (
    PresetNameTaken,
    PresetRecord,
    check_owner,
    check_settings,
    check_text,
    preset_record,
    prompt_changes,
)
from app.db.threads import FeatureStore, reads, writes
from app.db.usage import text_bytes

MAX_PRESETS_PER_OWNER = 50
MAX_NAME_CHARS = 100


class PresetRef(Enum):
    """What a session's preset argument may say besides a preset id or None (no preset)."""

    OWNER_DEFAULT = "owner-default"  # creating: the owner's default preset, or none when it has none
    KEEP = "keep"  # updating: leave the session's preset as it is


def _owned(s: Session, owner: str, preset_id: str) -> Preset | None:
    row = s.get(Preset, preset_id)
    return row if row is not None and row.owner == owner else None


def list_presets(s: Session, owner: str) -> list[PresetRecord]:
    """The owner's presets by name."""
    query = select(Preset).where(Preset.owner == owner).order_by(func.lower(Preset.name), Preset.id)
    return [preset_record(row) for row in s.scalars(query)]


def get_preset(s: Session, owner: str, preset_id: str) -> PresetRecord | None:
    """The owner's preset, or None."""
    row = _owned(s, owner, preset_id)
    return None if row is None else preset_record(row)


def session_preset_id(s: Session, owner: str, preset_id: str | None | PresetRef) -> str | None:
    """The preset a session of `owner` is to follow: the owner's default for OWNER_DEFAULT, else `preset_id`
    itself, which must be one of the owner's presets (ValueError naming it otherwise)."""
    if preset_id is PresetRef.OWNER_DEFAULT:
        return s.scalar(select(Preset.id).where(Preset.owner == owner, Preset.is_default.is_(True)))
    if preset_id is None:
        return None
    assert isinstance(preset_id, str), f"session_preset_id got {preset_id!r}"
    if _owned(s, owner, preset_id) is None:
        raise ValueError(f"preset_id {preset_id[:64]!r} is not one of your presets")
    return preset_id


def create_preset(
    s: Session,
    owner: str,
    name: str,
    *,
    system_prompt: str = "",
    settings: dict[str, Any] | None = None,
    is_default: bool = False,
) -> PresetRecord:
    """Create a preset; PresetNameTaken when the owner has one of that name, QuotaExceeded past
    MAX_PRESETS_PER_OWNER or the storage quota."""
    check_owner(owner)
    _check_preset_name(name)
    check_text("system_prompt", system_prompt)
    check_settings(settings)
    values = dict(
        name=name, system_prompt=system_prompt, settings=dict(settings or {}), is_default=bool(is_default)
    )
    num_presets = s.scalar(select(func.count()).where(Preset.owner == owner)) or 0
    if num_presets >= MAX_PRESETS_PER_OWNER:
        raise QuotaExceeded(
            f"you keep {num_presets} presets, the most one owner may keep (max_presets_per_owner "
            f"{MAX_PRESETS_PER_OWNER}); delete one to make room",
            limit_name="max_presets_per_owner",
            limit=MAX_PRESETS_PER_OWNER,
        )
    _check_name_free(s, owner, values["name"], None)
    check_room(s, quota_of(s), owner, new_bytes=text_bytes(values["name"], values["system_prompt"]))
    if values["is_default"]:
        _clear_default(s, owner, None)
    now = utcnow()
    row = Preset(owner=owner, **values)
    row.created_at = row.updated_at = now
    s.add(row)
    s.flush()
    return preset_record(row)


def update_preset(
    s: Session,
    owner: str,
    preset_id: str,
    *,
    name: str | None = None,
    system_prompt: str | None = None,
    settings: dict[str, Any] | None = None,
    is_default: bool | None = None,
) -> PresetRecord | None:
    """Change the fields given (settings are replaced whole; is_default True makes it the owner's one default);
    None when the preset is missing."""
    changes: dict[str, Any] = {}
    if name is not None:
        _check_preset_name(name)
        changes["name"] = name
    changes.update(prompt_changes(system_prompt, settings))
    if is_default is not None:
        changes["is_default"] = bool(is_default)
    row = _owned(s, owner, preset_id)
    if row is None:
        return None
    if "name" in changes and changes["name"] != row.name:
        _check_name_free(s, owner, changes["name"], row.id)
    grown = sum(
        text_bytes(changes[key]) - text_bytes(getattr(row, key))
        for key in ("name", "system_prompt")
        if key in changes
    )
    check_room(s, quota_of(s), owner, new_bytes=grown)
    if changes.get("is_default"):
        _clear_default(s, owner, row.id)
    for key, value in changes.items():
        setattr(row, key, value)
    row.updated_at = utcnow()
    s.flush()
    return preset_record(row)


def delete_preset(s: Session, owner: str, preset_id: str) -> bool:
    """Delete the owner's preset; the chats that followed it keep their own settings and fall back to the server's
    defaults for the rest. False when it is missing."""
    row = _owned(s, owner, preset_id)
    if row is None:
        return False
    following = update(ChatSession).where(ChatSession.owner == owner, ChatSession.preset_id == preset_id)
    s.execute(following.values(preset_id=None))
    s.delete(row)
    return True


def _check_name_free(s: Session, owner: str, name: str, preset_id: str | None) -> None:
    taken = s.scalar(select(Preset.id).where(Preset.owner == owner, Preset.name == name))
    if taken is not None and taken != preset_id:
        raise PresetNameTaken(f"you already have a preset named {name[:MAX_NAME_CHARS]!r}")


def _clear_default(s: Session, owner: str, keep_id: str | None) -> None:
    # the row about to become the default is left out: its ORM copy must still see the change to write it
    query = update(Preset).where(Preset.owner == owner, Preset.is_default.is_(True), Preset.id != keep_id)
    s.execute(query.values(is_default=False), execution_options={"synchronize_session": False})


def _check_preset_name(name: str) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"name must be a string of 1 to {MAX_NAME_CHARS} characters, got {name!r:.40}")
    check_text("name", name)


class PresetStore(FeatureStore):
    """Named system prompts and sampling settings per owner, which chats follow; owner-scoped like sessions."""

    list_presets = reads(list_presets)
    get_preset = reads(get_preset)
    create_preset = writes(create_preset)
    update_preset = writes(update_preset)
    delete_preset = writes(delete_preset)

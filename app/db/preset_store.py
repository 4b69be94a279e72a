"""The store's presets: async methods over app/db/presets.py, mixed into `Store` (which gives `_read`, `_tx`, and
`quota`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from app.db import presets
from app.db.presets import MAX_NAME_CHARS
from app.db.quota import StorageQuota
from app.db.records import PresetRecord, check_owner, check_settings, check_text

T = TypeVar("T")


class PresetMethods:
    """Named system prompts and sampling settings per owner, which chats follow; owner-scoped like sessions."""

    quota: StorageQuota
    if TYPE_CHECKING:  # given by Store (StoreThreads): a read on a reader thread, a write on the writer

        async def _read(self, fn: Callable[..., T], *args: Any) -> T: ...

        async def _tx(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def list_presets(self, owner: str) -> list[PresetRecord]:
        """The owner's presets by name."""
        return await self._read(presets.list_presets, owner)

    async def get_preset(self, owner: str, preset_id: str) -> PresetRecord | None:
        """The preset, or None when it does not exist or belongs to someone else."""
        return await self._read(presets.get_preset, owner, preset_id)

    async def create_preset(
        self,
        owner: str,
        name: str,
        *,
        system_prompt: str = "",
        settings: dict[str, Any] | None = None,
        is_default: bool = False,
    ) -> PresetRecord:
        """Create a preset; PresetNameTaken when the owner has one of that name, QuotaExceeded past the limits."""
        check_owner(owner)
        _check_preset_name(name)
        check_text("system_prompt", system_prompt)
        check_settings(settings)
        values = dict(
            name=name, system_prompt=system_prompt, settings=dict(settings or {}), is_default=bool(is_default)
        )
        return await self._tx(presets.create_preset, owner, values, self.quota)

    async def update_preset(
        self,
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
        if system_prompt is not None:
            check_text("system_prompt", system_prompt)
            changes["system_prompt"] = system_prompt
        if settings is not None:
            check_settings(settings)
            changes["settings"] = dict(settings)
        if is_default is not None:
            changes["is_default"] = bool(is_default)
        return await self._tx(presets.update_preset, owner, preset_id, changes, self.quota)

    async def delete_preset(self, owner: str, preset_id: str) -> bool:
        """Delete the preset (chats that followed it follow none); False when it is missing."""
        return await self._tx(presets.delete_preset, owner, preset_id)


def _check_preset_name(name: str) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise ValueError(f"name must be a string of 1 to {MAX_NAME_CHARS} characters, got {name!r:.40}")
    check_text("name", name)

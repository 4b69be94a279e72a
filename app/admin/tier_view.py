"""The admin page's view of the KV disk tier: its status in words, its directory, and the panel's figures."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.core.config import EngineConfig
from engine.core.paths import cache_dir
from engine.core.tier import TierStats


def tier_configured(config: EngineConfig) -> bool:
    """Whether the config asks for a disk tier (kv_disk_bytes not 0, and prefix caching on, which it extends)."""
    return config.kv_disk_bytes != 0 and config.enable_prefix_caching


def configured_tier_dir(config: EngineConfig) -> str:
    """The directory the config names for the tier (engine/tiers/setup.py's rule: kv_disk_dir, else <cache>/kv)."""
    return str(Path(config.kv_disk_dir).expanduser() if config.kv_disk_dir else cache_dir() / "kv")


def tier_status(tier: TierStats | None, *, configured: bool) -> str:
    """'on'; 'off' (not asked for); 'not opened' (asked for, unusable at start); 'turned off' (after an error)."""
    if tier is None:
        return "not opened" if configured else "off"
    return "on" if tier.enabled else "turned off"


def tier_panel(tier: TierStats | None, *, configured: bool, directory: str | None) -> dict[str, Any]:
    """The Disk tier panel as JSON: status and directory, then (with a tier) its counters, mean load seconds and
    blocks per load (null before the first load)."""
    panel: dict[str, Any] = {"status": tier_status(tier, configured=configured), "directory": directory}
    if tier is None:
        return panel
    loads = tier.num_loads
    return {
        **panel,
        **asdict(tier),
        "mean_load_seconds": tier.load_seconds_total / loads if loads else None,
        "blocks_per_load": tier.num_loaded_blocks / loads if loads else None,
    }

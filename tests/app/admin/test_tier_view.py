"""The admin page's view of the disk tier: its status in words, its directory, the panel's figures, the settings."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from app.admin.pages import disk_tier_rows
from app.admin.tier_view import configured_tier_dir, tier_configured, tier_panel, tier_status
from engine.core.config import EngineConfig
from tests.app.stats_factories import make_tier_stats


def test_a_tier_is_configured_unless_zero_bytes_or_no_prefix_caching():
    assert tier_configured(EngineConfig()) is True  # unset: the automatic cap
    assert tier_configured(EngineConfig(kv_disk_bytes=0)) is False
    assert tier_configured(EngineConfig(enable_prefix_caching=False)) is False


def test_the_configured_directory_follows_the_engine_rule(monkeypatch, tmp_path):
    assert configured_tier_dir(EngineConfig(kv_disk_dir=str(tmp_path / "kv-here"))) == str(
        tmp_path / "kv-here"
    )
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path / "cache"))
    assert configured_tier_dir(EngineConfig()) == str(tmp_path / "cache" / "kv")


def test_status_words():
    assert tier_status(None, configured=False) == "off"
    assert tier_status(None, configured=True) == "not opened"
    assert tier_status(make_tier_stats(), configured=True) == "on"
    assert tier_status(make_tier_stats(enabled=False), configured=True) == "turned off"


def test_the_panel_derives_load_latency_and_blocks_per_load():
    panel = tier_panel(make_tier_stats(), configured=True, directory="/srv/kv")
    assert (panel["status"], panel["directory"]) == ("on", "/srv/kv")
    assert (panel["mean_load_seconds"], panel["blocks_per_load"]) == (
        0.125,
        2.5,
    )  # 0.5 s and 10 blocks, 4 loads
    assert (panel["capacity_bytes"], panel["used_bytes"], panel["num_blocks"]) == (1024**2, 655360, 10)
    assert (panel["write_queue_depth"], panel["write_lag_seconds"], panel["num_write_drops"]) == (2, 0.25, 0)
    assert json.loads(json.dumps(panel)) == panel


def test_the_panel_before_any_load_and_without_a_tier():
    panel = tier_panel(
        make_tier_stats(num_loads=0, num_loaded_blocks=0, load_seconds_total=0.0),
        configured=True,
        directory="/kv",
    )
    assert (panel["mean_load_seconds"], panel["blocks_per_load"]) == (None, None)
    assert tier_panel(None, configured=False, directory=None) == {"status": "off", "directory": None}
    assert tier_panel(None, configured=True, directory="/kv") == {"status": "not opened", "directory": "/kv"}


def rows(config: EngineConfig, tier: object | None) -> list[tuple[str, str]]:
    """The rows for an engine with `config` and a tier (None: none opened) whose state is `tier`."""
    info = SimpleNamespace(
        config=config,
        tier_directory=str(tier.directory) if tier is not None else None,
        tier_capacity_bytes=tier.capacity_bytes if tier is not None else None,
    )
    return disk_tier_rows(info, tier.enabled if tier is not None else None)


def test_settings_rows_show_the_resolved_cap_and_directory():
    tier = SimpleNamespace(capacity_bytes=3 * 1024**3, directory=Path("/srv/kv"), enabled=True)
    assert rows(EngineConfig(), tier) == [
        ("KV disk tier", "3.0 GiB cap (auto)"),
        ("KV disk directory", "/srv/kv"),
    ]
    tier.enabled = False
    assert rows(EngineConfig(kv_disk_bytes=3 * 1024**3), tier)[0] == (
        "KV disk tier",
        "3.0 GiB cap · turned off after an error (see the log)",
    )


def test_settings_rows_say_why_there_is_no_tier(tmp_path):
    assert rows(EngineConfig(kv_disk_bytes=0), None) == [("KV disk tier", "off (kv_disk_bytes 0)")]
    assert rows(EngineConfig(enable_prefix_caching=False), None) == [
        ("KV disk tier", "off (needs prefix caching)")
    ]
    assert rows(EngineConfig(kv_disk_dir=str(tmp_path)), None) == [
        ("KV disk tier", "off: could not be opened (see the log)"),
        ("KV disk directory", str(tmp_path)),
    ]

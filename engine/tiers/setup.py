"""Opening an engine's disk tier: its directory (the configured one, or its own subdirectory of it: tier_dir.py), byte
cap, fingerprint and MAC key from the config; off, with one warning, when the directory or the key can't be used."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from engine.core.config import EngineConfig
from engine.core.paths import cache_dir
from engine.tiers.disk import DiskTier
from engine.tiers.fingerprint import kv_fingerprint, weight_files
from engine.tiers.tier_dir import claim_tier_dir
from engine.tiers.tier_key import BadTierKey, key_path, load_tier_key

logger = logging.getLogger(__name__)

DEFAULT_CAP_BYTES = 4 * 1024**3
DEFAULT_FREE_SHARE = 0.10
# staging copies of blocks waiting for the writer: bounds the memory a burst of finished turns takes and the lag
# (at ~1 GB/s of writes, well under a second)
WRITE_QUEUE_BYTES = 128 * 1024**2
MIN_WRITE_QUEUE_BLOCKS = 16


def tier_dir(config: EngineConfig) -> Path:
    """The configured directory, else <cache dir>/kv."""
    return Path(config.kv_disk_dir).expanduser() if config.kv_disk_dir else cache_dir() / "kv"


def default_capacity(directory: Path) -> int:
    """4 GiB or 10% of the free space of the directory's file system, whichever is smaller."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    return min(DEFAULT_CAP_BYTES, int(free * DEFAULT_FREE_SHARE))


def open_disk_tier(
    config: EngineConfig,
    weights: tuple[Path | None, Path | None],
    kv_settings: dict,
    values: torch.Tensor,
    scales: torch.Tensor | None,
) -> DiskTier | None:
    """The engine's disk tier, or None: turned off (kv_disk_bytes 0), or unusable here (logged once, with why).

    `weights`: (gguf file, folder) the weights come from; `kv_settings`: what else shapes the stored KV.
    """
    if config.kv_disk_bytes == 0 or not config.enable_prefix_caching:
        return None
    directory = tier_dir(config)
    block_bytes = values[:, :, 0].nbytes + (scales[:, :, 0].nbytes if scales is not None else 0)
    try:
        capacity = config.kv_disk_bytes if config.kv_disk_bytes is not None else default_capacity(directory)
        if capacity < block_bytes:
            logger.warning(
                "KV disk tier off: its cap of %d bytes holds no block of %d bytes (disk nearly full?)",
                capacity, block_bytes,
            )  # fmt: skip
            return None
        fingerprint = kv_fingerprint(weight_files(*weights), kv_settings)
        key = load_tier_key(key_path(config))
        owned = claim_tier_dir(directory)
        max_queued = max(MIN_WRITE_QUEUE_BLOCKS, WRITE_QUEUE_BYTES // block_bytes)
        return DiskTier(owned, capacity, fingerprint, values, scales, key=key, max_queued_blocks=max_queued)
    except (OSError, BadTierKey) as exc:
        logger.warning("KV disk tier off (serving goes on without it): %s: %s", type(exc).__name__, exc)
        return None

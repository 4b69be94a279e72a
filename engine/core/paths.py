"""Where pagedchat keeps what it builds once per machine: converted models, compiled kernels, the database."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "PAGEDCHAT_CACHE_DIR"
KV_TIER_KEY_FILE = (
    "kv-tier.key"  # the disk tier's MAC key: in the cache dir, or beside the service's database
)


def cache_dir(configured: str = "") -> Path:
    """Root of pagedchat's cache: `configured` if given, else $PAGEDCHAT_CACHE_DIR, else ~/.cache/pagedchat."""
    chosen = configured or os.environ.get(CACHE_DIR_ENV, "")
    return Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "pagedchat"

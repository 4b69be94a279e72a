"""The secret that keys the disk tier's block MACs: 32 random bytes in a file of its own (hex, mode 0600), made on
first use and kept outside the tier's directory (the service keeps it beside its database), so whoever can write
block files but not read this file cannot make a block the tier would serve."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

from engine.core.config import EngineConfig
from engine.core.paths import KV_TIER_KEY_FILE, cache_dir

logger = logging.getLogger(__name__)

KEY_BYTES = 32


class BadTierKey(ValueError):
    """The key file holds something other than a key."""


def key_path(config: EngineConfig) -> Path:
    """The configured key file, else <cache dir>/kv-tier.key."""
    return (
        Path(config.kv_disk_key_file).expanduser()
        if config.kv_disk_key_file
        else cache_dir() / KV_TIER_KEY_FILE
    )


def load_tier_key(path: Path) -> bytes:
    """The key in `path`, made there (0600) when missing; OSError, or BadTierKey when the file holds no key."""
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # written whole under another name, then linked into place: a second process starting at the same moment
    # either wins the link or reads the winner's key, never a half-written file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_bytes(KEY_BYTES).hex() + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
            logger.info("KV disk tier: made its key %s (0600)", path)
    finally:
        os.unlink(tmp)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "r") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        text = f.read(4 * KEY_BYTES).strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise BadTierKey(
            f"{path} is not a KV tier key ({KEY_BYTES} bytes in hex): delete it and a new one is made"
        )
    if mode & 0o077:
        logger.warning(
            "KV disk tier: its key %s has mode %o: who can read it and write the tier's directory can make blocks "
            "the tier serves (chmod 600 %s)",
            path, mode, path,
        )  # fmt: skip
    return key

"""A disk tier's block files as a benchmark sees them: cold reads (dropped from the page cache), settled writes."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

BLOCK_GLOB = "*.kvb"  # engine/tiers/block_file.py's SUFFIX; temporaries and the lock file are left alone


@dataclass(frozen=True)
class TierFiles:
    """How many block files a directory holds and their bytes."""

    num_files: int
    num_bytes: int


def drop_from_page_cache(directory: Path) -> TierFiles:
    """Write back and evict every block file's pages from the OS page cache, so the next read comes from the disk.

    POSIX_FADV_DONTNEED cannot evict dirty pages, so each file is fdatasync-ed first. A file the tier evicts
    meanwhile is skipped. Returns the files and bytes dropped.
    """
    num_files = num_bytes = 0
    for path in sorted(directory.glob(BLOCK_GLOB)):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            num_bytes += os.fstat(fd).st_size
            num_files += 1
        finally:
            os.close(fd)
    return TierFiles(num_files, num_bytes)


def tier_files(directory: Path) -> TierFiles:
    """The block files in `directory` now (one vanishing while counted is left out)."""
    num_files = num_bytes = 0
    for path in directory.glob(BLOCK_GLOB):
        with contextlib.suppress(FileNotFoundError):
            num_bytes += path.stat().st_size
            num_files += 1
    return TierFiles(num_files, num_bytes)


def wait_until_settled(
    directory: Path, quiet_s: float = 0.5, timeout_s: float = 60.0, poll_s: float = 0.1
) -> TierFiles:
    """Wait until the block files have not changed for `quiet_s` (the tier's writer has caught up), at most
    `timeout_s`; returns the files then."""
    deadline = time.monotonic() + timeout_s
    last, since = tier_files(directory), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        now = tier_files(directory)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return last

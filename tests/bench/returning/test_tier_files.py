"""bench/returning/tier_files.py: block files dropped from the page cache (checked with mincore), counted, and
waited on."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading
import time
from pathlib import Path

import pytest

from bench.returning.tier_files import TierFiles, drop_from_page_cache, tier_files, wait_until_settled

PAGE = mmap.PAGESIZE


def resident_pages(path: Path) -> int:
    """Pages of `path` in the page cache now (mincore over a private mapping, which touches nothing)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    size = path.stat().st_size
    num_pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * num_pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        start = ctypes.c_char.from_buffer(mm)  # a private mapping's untouched pages show the page cache
        try:
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec)
            assert rc == 0, os.strerror(ctypes.get_errno())
        finally:
            del start  # mmap cannot close while a ctypes view exports its buffer
    return sum(v & 1 for v in vec)


def make_file(path: Path, num_pages: int) -> Path:
    path.write_bytes(os.urandom(num_pages * PAGE))  # dirty pages, in the page cache
    return path


def test_drop_from_page_cache_evicts_block_files_only(tmp_path):
    blocks = [make_file(tmp_path / f"block-{i}.kvb", 64) for i in range(3)]
    other = make_file(tmp_path / "block-9.kvb.tmp", 64)
    for path in [*blocks, other]:
        path.read_bytes()
    if resident_pages(blocks[0]) == 0:
        pytest.skip("this file system keeps no pages of a file just read in the page cache")

    dropped = drop_from_page_cache(tmp_path)

    assert dropped == TierFiles(num_files=3, num_bytes=3 * 64 * PAGE)
    assert [resident_pages(p) for p in blocks] == [0, 0, 0]
    assert resident_pages(other) == 64  # temporaries (and the lock file) are not the tier's blocks


def test_drop_from_page_cache_of_an_empty_or_missing_directory_drops_nothing(tmp_path):
    assert drop_from_page_cache(tmp_path) == TierFiles(0, 0)
    assert drop_from_page_cache(tmp_path / "absent") == TierFiles(0, 0)


def test_tier_files_counts_block_files_and_their_bytes(tmp_path):
    make_file(tmp_path / "a.kvb", 2)
    make_file(tmp_path / "b.kvb", 3)
    (tmp_path / ".lock").write_bytes(b"")
    assert tier_files(tmp_path) == TierFiles(2, 5 * PAGE)


def test_wait_until_settled_waits_for_a_writer_to_stop(tmp_path):
    def writer() -> None:
        for i in range(5):
            make_file(tmp_path / f"w{i}.kvb", 1)
            time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    settled = wait_until_settled(tmp_path, quiet_s=0.3, timeout_s=10.0, poll_s=0.02)
    thread.join()
    assert settled == TierFiles(5, 5 * PAGE)


def test_wait_until_settled_gives_up_after_its_timeout(tmp_path):
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            make_file(tmp_path / f"w{i}.kvb", 1)
            i += 1
            time.sleep(0.01)

    thread = threading.Thread(target=writer)
    thread.start()
    started = time.monotonic()
    try:
        wait_until_settled(tmp_path, quiet_s=0.5, timeout_s=0.3, poll_s=0.02)
    finally:
        stop.set()
        thread.join()
    assert time.monotonic() - started < 0.45

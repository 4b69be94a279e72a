"""trim_heap gives malloc's free pages back: a heap left full of freed chunks behind one live allocation (which
keeps the top of the heap, so malloc cannot shrink it by itself) shrinks once it is called."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, ctypes.util, json
from engine.core.memory import process_rss_bytes, trim_heap
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
chunks = [libc.malloc(64 << 10) for _ in range(3200)]  # 200 MiB in chunks below the mmap threshold: the heap
for p in chunks:
    ctypes.memset(p, 1, 64 << 10)
keep = libc.malloc(64 << 10)  # above them all: the heap's top stays in use
for p in chunks:
    libc.free(p)
before = process_rss_bytes()
trimmed = trim_heap()
print(json.dumps({"before": before, "after": process_rss_bytes(), "trimmed": trimmed}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_heap_returns_freed_heap_pages():
    import json

    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trimmed"] is True
    assert result["before"] - result["after"] > 150 << 20, result  # most of the 200 MiB freed went back

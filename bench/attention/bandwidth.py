"""The machine's streaming read bandwidth: a buffer several times the last-level cache, read once per pass."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.native.huge_pages import zeros_on_huge_pages
from engine.native.stream import StreamReader

CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
FALLBACK_LLC_BYTES = 32 * 2**20
LLC_MULTIPLE = 4  # a buffer this many times the LLC leaves (almost) nothing of it in cache between passes
MIN_PASSES = 5
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


@dataclass(frozen=True)
class CacheSize:
    """The last-level cache's size in bytes and where that figure came from."""

    num_bytes: int
    source: str


def last_level_cache(sysfs: Path = CACHE_SYSFS) -> CacheSize:
    """The level-3 cache of cpu0 as sysfs reports it, else 32 MiB (and a note saying so)."""
    for index in sorted(sysfs.glob("index*")):
        try:
            if (index / "level").read_text().strip() != "3":
                continue
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        size = parse_size(text)
        if size:
            return CacheSize(size, f"{index / 'size'}: {text}")
    return CacheSize(FALLBACK_LLC_BYTES, f"no level-3 cache under {sysfs}; assumed 32 MiB")


def parse_size(text: str) -> int | None:
    """'32768K' -> 33554432; None for text sysfs should not hold."""
    text = text.strip().upper().removesuffix("B")
    scale = _UNITS.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in _UNITS else text
    return int(digits) * scale if digits.isdigit() else None


@dataclass(frozen=True)
class StreamResult:
    """GB/s (10^9 bytes a second) of repeated full reads of one buffer."""

    buffer_bytes: int
    num_threads: int
    passes: int
    best_gb_per_s: float
    median_gb_per_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "buffer_bytes": self.buffer_bytes,
            "num_threads": self.num_threads,
            "passes": self.passes,
            "best_gb_per_s": self.best_gb_per_s,
            "median_gb_per_s": self.median_gb_per_s,
        }


def measure_stream(
    reader: StreamReader, buffer_bytes: int, num_threads: int, min_seconds: float = 0.5
) -> StreamResult:
    """Read a buffer of ones (on huge pages, as the KV pool) until `min_seconds` and >= 5 passes have gone by."""
    num_floats = max(buffer_bytes // 4, 1)
    buffer = zeros_on_huge_pages((num_floats,), dtype=torch.float32, device=torch.device("cpu"))
    buffer.fill_(1.0)
    total = reader.read(buffer, num_threads)  # warm-up, and a check that every element was read
    if total != num_floats:
        raise RuntimeError(f"stream_read summed {total} over {num_floats} ones")
    seconds: list[float] = []
    start = time.perf_counter()
    while len(seconds) < MIN_PASSES or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        reader.read(buffer, num_threads)
        seconds.append(time.perf_counter() - t0)
    nbytes = num_floats * 4
    return StreamResult(
        buffer_bytes=nbytes,
        num_threads=num_threads,
        passes=len(seconds),
        best_gb_per_s=nbytes / min(seconds) / 1e9,
        median_gb_per_s=nbytes / statistics.median(seconds) / 1e9,
    )

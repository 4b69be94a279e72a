"""The machine's available memory and byte counts in words: for the loader's refusal, the start-up line and /admin."""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class WeightMemory:
    """Bytes of the model's weights: kept in quantized blocks, and in float (norms, biases, float linears...)."""

    blocks: int
    float: int

    @property
    def total(self) -> int:
        return self.blocks + self.float


def available_memory_bytes() -> int | None:
    """Memory the machine can still give without swapping: psutil's `available`, else /proc/meminfo's MemAvailable;
    None where neither is known."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def human_bytes(num_bytes: int | float) -> str:
    """Bytes in decimal units: '1.07 GB', '12.6 MB', '512 kB'."""
    if num_bytes >= 0.1 * GB:
        return f"{num_bytes / GB:.2f} GB"
    if num_bytes >= 1e6:
        return f"{num_bytes / 1e6:.1f} MB"
    return f"{num_bytes / 1e3:.0f} kB"

"""The cores' arithmetic peak (peak.c, via ctypes): fp32 FMA and int8 dot-product operations a second.

A matmul's time says little on its own; `bench step` reports the linears' rate as a share of what the same threads
can compute at all, the way `bench attention` reports its bandwidth as a share of a streaming read (stream.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from engine.native.build import load_library

SOURCE = Path(__file__).with_name("peak.c")
ITERATIONS = 20_000_000  # ~0.1-0.2 s a loop on a 3 GHz core


@dataclass(frozen=True)
class ComputePeak:
    """Operations a second on `threads` threads: fp32 FMA flops, and int8 dot-product ops (2 per byte product)."""

    threads: int
    fp32_gflops: float
    int8_gops: float


class PeakLoops:
    """peak.c's two loops: each returns (operations a second, the checksum of its accumulators); the rate is -1
    where the library was built without AVX2 and FMA."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {}
        for name in ("peak_fp32", "peak_int8"):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_double
            fn.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
            self._fns[name] = fn

    def _run(self, name: str, iterations: int, threads: int) -> tuple[float, float]:
        checksum = ctypes.c_double()
        rate = self._fns[name](iterations, threads, ctypes.byref(checksum))
        return rate, checksum.value

    def fp32(self, iterations: int, threads: int) -> tuple[float, float]:
        return self._run("peak_fp32", iterations, threads)

    def int8(self, iterations: int, threads: int) -> tuple[float, float]:
        return self._run("peak_int8", iterations, threads)


def load_peak_loops() -> PeakLoops | None:
    """The loops for this machine, compiled on first use; None when native code is disabled or cannot be built."""
    lib = load_library(SOURCE)
    return PeakLoops(lib) if lib is not None else None


def measure_peak(threads: int, iterations: int = ITERATIONS) -> ComputePeak | None:
    """The peak on `threads` threads (the better of two runs of each loop), or None without the loops' AVX2."""
    loops = load_peak_loops()
    if loops is None:
        return None
    fp32 = max(loops.fp32(iterations, threads)[0] for _ in range(2))
    int8 = max(loops.int8(iterations, threads)[0] for _ in range(2))
    if min(fp32, int8) <= 0:
        return None
    return ComputePeak(threads=threads, fp32_gflops=fp32 / 1e9, int8_gops=int8 / 1e9)

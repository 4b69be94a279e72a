"""A streaming read of a buffer (stream.c, via ctypes): the machine's read bandwidth, the bound for decode attention.

Decode attention reads each cached K/V byte once per layer and does little arithmetic per byte, so its best
possible time is the KV bytes over the rate at which the cores can stream memory. `bench attention` measures that
rate with this reader, on the same threads as the kernel, and reports the kernel's bandwidth as a fraction of it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from engine.native.build import load_library

SOURCE = Path(__file__).with_name("stream.c")


class StreamReader:
    """`stream_read` of the compiled library: the sum of an fp32 buffer, read once by several threads."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.stream_read
        self._fn.restype = ctypes.c_double
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]

    def read(self, buffer: torch.Tensor, num_threads: int | None = None) -> float:
        """The sum of `buffer` (contiguous fp32 on the CPU), read by `num_threads` (default: torch's threads)."""
        assert buffer.dtype == torch.float32 and buffer.device.type == "cpu", "an fp32 CPU buffer"
        assert buffer.is_contiguous(), "the buffer must be contiguous"
        threads = num_threads if num_threads is not None else torch.get_num_threads()
        return self._fn(buffer.data_ptr(), buffer.numel(), threads)


def load_stream_reader() -> StreamReader | None:
    """The reader for this machine, compiling it on first use; None when native code is disabled or cannot be built."""
    lib = load_library(SOURCE)
    return StreamReader(lib) if lib is not None else None

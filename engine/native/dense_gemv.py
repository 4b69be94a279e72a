"""fp32 GEMV for a few rows (dense_gemv.c, via ctypes): the decode step of a float model's linears on the CPU."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from engine.native.build import load_library

SOURCE = Path(__file__).with_name("dense_gemv.c")
MAX_ROWS = 4  # dense_gemv.c's GEMV_ROWS: more rows go to torch's GEMM


class DenseGemv:
    """`gemv_f32` of the compiled library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        self._fn = lib.gemv_f32
        self._fn.restype = i32
        self._fn.argtypes = [ptr, i64, i32, i32, ptr, i64, i32, ptr, ptr, i64, i32]

    def applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether `linear` takes this call: fp32 CPU tensors, unit stride over features, 1..MAX_ROWS rows."""
        return (
            x.dim() == 2
            and 1 <= x.shape[0] <= MAX_ROWS
            and x.dtype == weight.dtype == torch.float32
            and x.device.type == weight.device.type == "cpu"
            and x.stride(1) == 1
            and weight.stride(1) == 1
            and not x.requires_grad
        )

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight^T (+ bias) as [rows, out] fp32; `applies(x, weight)` must hold."""
        out_features, in_features = weight.shape
        assert x.shape[1] == in_features, f"x has {x.shape[1]} features, the weight {in_features}"
        if bias is not None:
            assert bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (out_features,)
        y = torch.empty(x.shape[0], out_features)
        status = self._fn(
            weight.data_ptr(),
            weight.stride(0),
            out_features,
            in_features,
            x.data_ptr(),
            x.stride(0),
            x.shape[0],
            None if bias is None else bias.data_ptr(),
            y.data_ptr(),
            y.stride(0),
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"gemv_f32 rejected its inputs (status {status})")
        return y


def load_dense_gemv() -> DenseGemv | None:
    """The GEMV for this machine (built on first use); None where native code is disabled or cannot be built."""
    lib = load_library(SOURCE)
    return DenseGemv(lib) if lib is not None else None

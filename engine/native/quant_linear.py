"""Weight-only quantized linears for the CPU (quant_linear.c via ctypes) and the `QuantLinear` module over them.

Single-stream decode is a stream over every weight once per token: SmolLM2-135M is ~540 MB in fp32 but ~98 MB in
GGUF's Q4_1/Q8_0 blocks, so a linear that reads the blocks directly is up to ~5x less memory traffic. Few rows
(decode: up to GEMV_MAX_ROWS) go to the compiled kernel, which reads each block once for all rows; more rows
(prefill, a busy decode step) are compute-bound and take the batch GEMM the engine chose (EngineConfig.batch_gemm):
fp32 tiles of dequantized blocks multiplied by torch's GEMM, a bf16 copy of the weights, or the integer GEMM over
the blocks with int8 activations.
Without a compiler (or with PAGEDCHAT_NATIVE=0) the pure-torch twin runs instead.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.native.build import load_library
from engine.native.quant_format import QuantType, QuantWeight, dequantize_torch, quant_linear_torch

__all__ = [
    "BATCH_GEMMS",
    "BF16_GEMV_MAX_ROWS",
    "GEMV_MAX_ROWS",
    "NativeQuantLinear",
    "QuantLinear",
    "load_kernel",
]

SOURCE = Path(__file__).with_name("quant_linear.c")
GEMV_MAX_ROWS = 16  # rows up to which the kernel beats dequantize + GEMM (bench/tools/bench_quant_linear.py)
# with batch_gemm bf16 (a CPU with fast bf16): rows up to which the kernel beats torch's bf16 GEMM. `pagedchat bench step` on
# a 2-core AVX512-BF16 EPYC, SmolLM2's decode step: the fused GEMV step takes ~2.7 ms a sequence (8: 21.4 ms, 16:
# 44.5), the bf16 module path ~28 ms from 5 to 12 sequences (it reads the 2-byte weights: 31.3 ms at 16)
BF16_GEMV_MAX_ROWS = 10
BATCH_GEMMS = ("fp32", "bf16", "int8")  # how QuantLinear multiplies more rows than its GEMV bound
TILE_WEIGHTS = (
    1 << 20
)  # weights per dequantized fp32 tile on the GEMM path: 4 MB, cache-resident for the GEMM

_lock = threading.Lock()
_kernels: dict[int, NativeQuantLinear] = {}


class NativeQuantLinear:
    """The compiled `quant_linear` and `dequantize`; both take fp32 and write fp32."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        self._linear = lib.quant_linear
        self._linear.restype = i32
        self._linear.argtypes = [i32, i32, ptr, i64, i32, i32, ptr, i64, i32, ptr, ptr, i64, i32]
        self._gemm_q8 = lib.quant_gemm_q8
        self._gemm_q8.restype = i32
        self._gemm_q8.argtypes = [i32, ptr, i64, i32, i32, ptr, i64, i32, ptr, ptr, i64, i32]
        self._dequantize = lib.dequantize
        self._dequantize.restype = i32
        self._dequantize.argtypes = [i32, ptr, i64, i32, i32, ptr, i64, i32]

    def linear(
        self,
        x: torch.Tensor,  # [rows, in] fp32, unit stride over in
        weight: QuantWeight,
        bias: torch.Tensor | None,  # [out] fp32 or None
        *,
        act_q8: bool,
    ) -> torch.Tensor:
        """x @ W^T (+ bias) as [rows, out] fp32; act_q8 quantizes x per 32-block to int8 first (faster, inexact)."""
        in_features = x.shape[1]
        assert x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(1) == 1, "fp32 CPU rows only"
        assert in_features == weight.in_features, f"x has {in_features} features, weight {weight.in_features}"
        if bias is not None:
            assert (
                bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (weight.out_features,)
            )
        return self.linear_rows(x, weight.blocks, int(weight.qtype), in_features, bias, act_q8)

    def linear_rows(
        self,
        x: torch.Tensor,  # [rows, in] fp32 on the CPU, unit stride over in (the caller checked)
        blocks: torch.Tensor,  # [out, row bytes] uint8, contiguous
        qtype: int,
        in_features: int,
        bias: torch.Tensor | None,  # [out] fp32 or None
        act_q8: bool,
    ) -> torch.Tensor:
        """`linear` without its checks, for callers that made them once (QuantLinear's decode path): a decode step
        makes ~120 of these calls, so each Python-side microsecond here is ~0.1 ms a token."""
        status, y = self._rows(self._linear, (qtype, act_q8), x, blocks, in_features, bias)
        if status != 0:
            raise RuntimeError(f"quant_linear rejected its inputs (status {status})")
        return y

    @staticmethod
    def _rows(
        fn: ctypes._CFuncPtr,
        leading: tuple[int, ...],
        x: torch.Tensor,
        blocks: torch.Tensor,
        in_features: int,
        bias: torch.Tensor | None,
    ) -> tuple[int, torch.Tensor]:
        """fn(*leading, the blocks, x's rows, bias, a new y) for quant_linear and quant_gemm_q8, which share
        their arguments after the leading ones; (its status, y)."""
        rows, out_features = x.shape[0], blocks.shape[0]
        y = torch.empty((rows, out_features), dtype=torch.float32)
        status = fn(
            *leading,
            blocks.data_ptr(),
            blocks.shape[1],
            out_features,
            in_features,
            x.data_ptr(),
            x.stride(0),
            rows,
            None if bias is None else bias.data_ptr(),
            y.data_ptr(),
            out_features,
            torch.get_num_threads(),
        )
        return status, y

    def gemm_q8(self, x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ W^T (+ bias) for many rows with int8 activations (quant_gemm_q8: a register-tiled integer GEMM on
        AVX2, the q8 row kernel elsewhere)."""
        assert x.dtype == torch.float32 and x.stride(1) == 1 and x.shape[1] == weight.in_features
        status, y = self._rows(
            self._gemm_q8, (int(weight.qtype),), x, weight.blocks, weight.in_features, bias
        )
        if status != 0:
            raise RuntimeError(f"quant_gemm_q8 rejected its inputs (status {status})")
        return y

    def dequantize(
        self, weight: QuantWeight, start: int = 0, stop: int | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rows [start, stop) of the weight as fp32 [stop - start, in] (into `out` when given: fp32 CPU rows of unit
        stride, e.g. the rows of a float parameter being loaded)."""
        stop = weight.out_features if stop is None else stop
        assert 0 <= start <= stop <= weight.out_features, f"rows [{start}, {stop}) of {weight.out_features}"
        if out is None:
            out = torch.empty((stop - start, weight.in_features), dtype=torch.float32)
        assert (
            out.dtype == torch.float32
            and out.shape == (stop - start, weight.in_features)
            and out.stride(1) == 1
        )
        blocks = weight.blocks[start:stop]
        status = self._dequantize(
            int(weight.qtype),
            blocks.data_ptr(),
            blocks.stride(0),
            stop - start,
            weight.in_features,
            out.data_ptr(),
            out.stride(0),
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"dequantize rejected its inputs (status {status})")
        return out

    def gemm(self, x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ W^T (+ bias) for many rows: fp32 tiles of W dequantized in turn, each multiplied by torch's GEMM."""
        out_features = weight.out_features
        tile_rows = max(1, TILE_WEIGHTS // weight.in_features)
        if tile_rows >= out_features:
            return F.linear(x, self.dequantize(weight), bias)
        y = torch.empty((x.shape[0], out_features), dtype=torch.float32)
        for start in range(0, out_features, tile_rows):
            stop = min(start + tile_rows, out_features)
            torch.mm(x, self.dequantize(weight, start, stop).t(), out=y[:, start:stop])
        if bias is not None:
            y += bias
        return y


def load_kernel(march: str = "native") -> NativeQuantLinear | None:
    """The kernels for this machine (or the instruction set `march`: see build.load_library), compiled on first use;
    None when disabled or they cannot be built."""
    lib = load_library(SOURCE, march)
    if lib is None:
        return None
    with _lock:
        if id(lib) not in _kernels:
            _kernels[id(lib)] = NativeQuantLinear(lib)
        return _kernels[id(lib)]


class QuantLinear(nn.Module):
    """A linear layer whose weight stays in GGUF blocks: y = x @ W^T (+ bias), computed in fp32.

    act_q8=True lets the decode path (few rows) quantize activations to int8 per 32-block, as llama.cpp does:
    ~1.4x less CPU time on AVX2 (bench/tools/bench_quant_linear.py), with an error bounded by (block amax of x / 254)
    @ |W|^T (see tests/engine/test_quant_linear.py).
    act_q8=False is exact: fp32 activations times the dequantized weights, up to fp32 summation order.
    batch_gemm, for more rows than the GEMV bound (prefill, a busy decode step):
    - "fp32": tiles of the dequantized weight multiplied by torch's fp32 GEMM (exact up to summation order);
    - "bf16": from BF16_GEMV_MAX_ROWS rows, a bf16 copy of the dequantized weight, made on first use (+2 bytes a
      weight), with torch's bf16 GEMM (fp32 accumulation): on a CPU with AVX512-BF16 several times faster than fp32
      tiles, with the activations and weights rounded to bf16;
    - "int8": the activations rounded to int8 per 32-block, as act_q8 does, and an integer GEMM over the blocks
      (quant_gemm_q8: no copy, no dequantized tiles); the error bound is act_q8's.
    """

    def __init__(
        self,
        weight: QuantWeight,
        bias: torch.Tensor | None = None,
        *,
        act_q8: bool = False,
        batch_gemm: str = "fp32",
    ) -> None:
        super().__init__()
        if batch_gemm not in BATCH_GEMMS:
            raise ValueError(f"batch_gemm must be one of {BATCH_GEMMS}, got {batch_gemm!r}")
        self.batch_gemm = batch_gemm
        # rows up to which the exact GEMV kernel runs (the fused decode step takes the same bound)
        self.gemv_max_rows = BF16_GEMV_MAX_ROWS if batch_gemm == "bf16" else GEMV_MAX_ROWS
        # batch_gemm bf16's copy, made on first use; not a buffer: the blocks are the weight
        self._weight_bf16: torch.Tensor | None = None
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.qtype = int(weight.qtype)  # a plain int: passed to the kernel on every call
        self.act_q8 = act_q8
        self.register_buffer("blocks", weight.blocks)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.kernel = load_kernel()

    @property
    def weight_q(self) -> QuantWeight:
        """The weight's blocks, as a QuantWeight."""
        return QuantWeight(QuantType(self.qtype), self.blocks, self.in_features)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight as fp32 [out, in] (for checks and fallbacks)."""
        return dequantize_torch(self.weight_q)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, qtype={QuantType(self.qtype).name}, "
            f"bias={self.bias is not None}, act_q8={self.act_q8}, batch_gemm={self.batch_gemm}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.kernel is not None
            and x.dtype == torch.float32
            and x.dim() == 2
            and x.shape[0] <= self.gemv_max_rows
            and x.stride(1) == 1
            and not x.is_cuda
            and (self.bias is None or self.bias.dtype == torch.float32)
        ):
            return self.kernel.linear_rows(
                x, self.blocks, self.qtype, self.in_features, self.bias, self.act_q8
            )
        weight = self.weight_q
        if self.kernel is None or x.device.type != "cpu":
            return quant_linear_torch(x, weight, self.bias)
        x2 = x.reshape(-1, self.in_features)  # [rows, in]
        x2 = x2.float() if x2.stride(-1) == 1 else x2.float().contiguous()
        bias = None if self.bias is None else self.bias.float()
        if x2.shape[0] <= self.gemv_max_rows:
            y = self.kernel.linear(x2, weight, bias, act_q8=self.act_q8)
        elif self.batch_gemm == "bf16":
            if self._weight_bf16 is None:
                self._weight_bf16 = self.kernel.dequantize(weight).to(torch.bfloat16)
            y = F.linear(x2.to(torch.bfloat16), self._weight_bf16).float()
            if bias is not None:
                y += bias
        elif self.batch_gemm == "int8":
            y = self.kernel.gemm_q8(x2, weight, bias)
        else:
            y = self.kernel.gemm(x2, weight, bias)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.native.build import load_library
from engine.native.quant_format import R8_ROWS, QuantType, QuantWeight, dequantize_torch, quant_linear_torch

__all__ = [
    "BATCH_GEMMS",
    "GEMV_MAX_ROWS",
    "NativeQuantLinear",
    "QuantLinear",
    "load_kernel",
]

SOURCE = Path(__file__).with_name("quant_linear.c")
GEMV_MAX_ROWS = 16  # rows up to which the kernel beats dequantize + GEMM (bench/tools/bench_quant_linear.py)
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
        self._gather = lib.dequantize_gather
        self._gather.restype = i32
        self._gather.argtypes = [i32, ptr, i64, i64, ptr, i32, i32, ptr, i64, i32]
        self._repack = lib.repack_q4k_r8
        self._repack.restype = i32
        self._repack.argtypes = [ptr, i64, i32, i32, ptr, i32]

    def repack(self, weight: QuantWeight, out: torch.Tensor | None = None) -> QuantWeight:
        """A Q4_K weight (out_features % 8 == 0) repacked as Q4_K_R8 (into `out` when given: uint8 [out, in / 256 *
        148], contiguous, e.g. on huge pages), as quant_format.repack_rows8 repacks it."""
        assert weight.qtype is QuantType.Q4_K, f"only Q4_K repacks, not {weight.qtype.name}"
        if weight.out_features % R8_ROWS:
            raise ValueError(f"Q4_K_R8 holds groups of {R8_ROWS} rows, not {weight.out_features}")
        packed = QuantType.Q4_K_R8
        shape = (weight.out_features, weight.in_features // packed.block_weights * packed.block_bytes)
        out = torch.empty(shape, dtype=torch.uint8) if out is None else out
        assert out.dtype == torch.uint8 and out.shape == shape and out.is_contiguous()
        status = self._repack(
            weight.blocks.data_ptr(),
            weight.blocks.stride(0),
            weight.out_features,
            weight.in_features,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"repack_q4k_r8 rejected its inputs (status {status})")
        return QuantWeight(packed, out, weight.in_features)

    def linear(
        self,
        x: torch.Tensor,  # [rows, in] fp32, unit stride over in
        weight: QuantWeight | Sequence[QuantWeight],  # one format, or segments stacked by output rows
        bias: torch.Tensor | None,  # [out] fp32 or None
        *,
        act_q8: bool,
    ) -> torch.Tensor:
        """x @ W^T (+ bias) as [rows, out] fp32; act_q8 quantizes x per 32-block to int8 first (faster, inexact)."""
        segments = _segments(weight)
        in_features, out_features = x.shape[1], sum(s.out_features for s in segments)
        assert x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(1) == 1, "fp32 CPU rows only"
        assert all(in_features == s.in_features for s in segments), (
            f"x has {in_features} features, weight not"
        )
        if bias is not None:
            assert bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (out_features,)
        if len(segments) == 1:
            return self.linear_rows(x, segments[0].blocks, int(segments[0].qtype), in_features, bias, act_q8)
        return self.linear_segments(x, segment_args(segments), in_features, out_features, bias, act_q8)

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

    def linear_segments(
        self,
        x: torch.Tensor,  # [rows, in] fp32 on the CPU, unit stride over in (the caller checked)
        segments: Sequence[
            tuple[torch.Tensor, int, int]
        ],  # (blocks [seg out, row bytes], qtype, first column)
        in_features: int,
        out_features: int,
        bias: torch.Tensor | None,  # [out] fp32 or None
        act_q8: bool,
    ) -> torch.Tensor:
        """`linear_rows` for a weight of several formats stacked by output rows: each segment's kernel call writes
        its own columns of one y (the kernels take y's row stride), with its slice of the bias."""
        y = torch.empty((x.shape[0], out_features), dtype=torch.float32)
        for blocks, qtype, start in segments:
            if self._into(self._linear, (qtype, act_q8), x, blocks, in_features, bias, y, start) != 0:
                raise RuntimeError(f"quant_linear rejected its inputs (type {qtype})")
        return y

    @staticmethod
    def _into(
        fn: ctypes._CFuncPtr,
        leading: tuple[int, ...],
        x: torch.Tensor,
        blocks: torch.Tensor,
        in_features: int,
        bias: torch.Tensor | None,  # [y's columns] fp32 or None
        y: torch.Tensor,  # [rows, columns] fp32, contiguous
        start: int,  # the first column of y (and element of bias) that this weight's rows give
    ) -> int:
        """fn(*leading, the blocks, x's rows, bias from start, y from column start): its status."""
        return fn(
            *leading,
            blocks.data_ptr(),
            blocks.shape[1],
            blocks.shape[0],
            in_features,
            x.data_ptr(),
            x.stride(0),
            x.shape[0],
            None if bias is None else bias.data_ptr() + 4 * start,
            y.data_ptr() + 4 * start,
            y.shape[1],
            torch.get_num_threads(),
        )

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

    def gemm_q8(
        self, x: torch.Tensor, weight: QuantWeight | Sequence[QuantWeight], bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x @ W^T (+ bias) for many rows with int8 activations (quant_gemm_q8: a register-tiled integer GEMM on
        AVX2, the q8 row kernel elsewhere), each segment into its columns."""
        segments = _segments(weight)
        in_features = segments[0].in_features
        assert x.dtype == torch.float32 and x.stride(1) == 1 and x.shape[1] == in_features
        y = torch.empty((x.shape[0], sum(s.out_features for s in segments)), dtype=torch.float32)
        for blocks, qtype, start in segment_args(segments):
            status = self._into(self._gemm_q8, (qtype,), x, blocks, in_features, bias, y, start)
            if status != 0:
                raise RuntimeError(f"quant_gemm_q8 rejected its inputs (status {status})")
        return y

    def gather(self, weight: QuantWeight, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` (int64 [n]) of the weight as fp32 [n, in] (dequantize_gather): an embedding's rows from its
        blocks, each equal to `dequantize` of that row. IndexError for an index outside the rows."""
        index = index.contiguous()
        assert index.dtype == torch.int64 and index.dim() == 1, "index must be int64 [n]"
        out = torch.empty((index.shape[0], weight.in_features), dtype=torch.float32)
        status = self._gather(
            int(weight.qtype),
            weight.blocks.data_ptr(),
            weight.blocks.shape[1],
            weight.out_features,
            index.data_ptr(),
            index.shape[0],
            weight.in_features,
            out.data_ptr(),
            weight.in_features,
            torch.get_num_threads(),
        )
        if status != 0:
            raise IndexError(
                f"a row index outside [0, {weight.out_features}) or a bad format (status {status})"
            )
        return out

    def dequantize(
        self, weight: QuantWeight, start: int = 0, stop: int | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rows [start, stop) of the weight as fp32 [stop - start, in] (into `out` when given: fp32 CPU rows of unit
        stride, e.g. the rows of a float parameter being loaded)."""
        stop = weight.out_features if stop is None else stop
        assert 0 <= start <= stop <= weight.out_features, f"rows [{start}, {stop}) of {weight.out_features}"
        if weight.qtype is QuantType.Q4_K_R8 and (start % R8_ROWS or stop % R8_ROWS):  # whole groups only
            first, last = start - start % R8_ROWS, -(-stop // R8_ROWS) * R8_ROWS
            rows = self.dequantize(weight, first, last)[start - first : stop - first]
            if out is None:
                return rows
            out.copy_(rows)
            return out
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

    def gemm(
        self, x: torch.Tensor, weight: QuantWeight | Sequence[QuantWeight], bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x @ W^T (+ bias) for many rows: fp32 tiles of W dequantized in turn (segment by segment), each multiplied
        by torch's GEMM."""
        segments = _segments(weight)
        tile_rows = max(R8_ROWS, TILE_WEIGHTS // segments[0].in_features // R8_ROWS * R8_ROWS)  # whole groups
        if len(segments) == 1 and tile_rows >= segments[0].out_features:
            return F.linear(x, self.dequantize(segments[0]), bias)
        y = torch.empty((x.shape[0], sum(s.out_features for s in segments)), dtype=torch.float32)
        column = 0
        for segment in segments:
            for start in range(0, segment.out_features, tile_rows):
                stop = min(start + tile_rows, segment.out_features)
                tile = self.dequantize(segment, start, stop)
                torch.mm(x, tile.t(), out=y[:, column + start : column + stop])
            column += segment.out_features
        if bias is not None:
            y += bias
        return y


def _segments(weight: QuantWeight | Sequence[QuantWeight]) -> tuple[QuantWeight, ...]:
    return (weight,) if isinstance(weight, QuantWeight) else tuple(weight)


def segment_args(segments: Sequence[QuantWeight]) -> tuple[tuple[torch.Tensor, int, int], ...]:
    """(blocks, qtype, first output column) of each segment, as `linear_segments` takes them."""
    args, start = [], 0
    for segment in segments:
        args.append((segment.blocks, int(segment.qtype), start))
        start += segment.out_features
    return tuple(args)


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

    The weight is one QuantWeight, or several stacked by output rows ("segments", each in its own format, one width):
    llama-quantize's Q4_K_M keeps q/k in Q4_K and v in Q6_K in some layers, which one fused qkv_proj still runs,
    each segment's kernel writing its columns of y.
    act_q8=True lets the decode path (few rows) quantize activations to int8 per 32-block, as llama.cpp does:
    ~1.4x less CPU time on AVX2 (bench/tools/bench_quant_linear.py), with an error bounded by (block amax of x / 254)
    @ |W|^T (see tests/engine/test_quant_linear.py).
    act_q8=False is exact: fp32 activations times the dequantized weights, up to fp32 summation order.
    batch_gemm, for more rows than the GEMV bound (prefill, a busy decode step):
    - "fp32": tiles of the dequantized weight multiplied by torch's fp32 GEMM (exact up to summation order);
    - "bf16": past GEMV_MAX_ROWS rows, a bf16 copy of the dequantized weight, made on first use (+2 bytes a
      weight), with torch's bf16 GEMM (fp32 accumulation): on a CPU with AVX512-BF16 several times faster than fp32
      tiles, with the activations and weights rounded to bf16;
    - "int8": the activations rounded to int8 per 32-block, as act_q8 does, and an integer GEMM over the blocks
      (quant_gemm_q8: no copy, no dequantized tiles); the error bound is act_q8's.
    """

    def __init__(
        self,
        weight: QuantWeight | Sequence[QuantWeight],
        bias: torch.Tensor | None = None,
        *,
        act_q8: bool = False,
        batch_gemm: str = "fp32",
    ) -> None:
        super().__init__()
        if batch_gemm not in BATCH_GEMMS:
            raise ValueError(f"batch_gemm must be one of {BATCH_GEMMS}, got {batch_gemm!r}")
        segments = _segments(weight)
        if not segments or any(s.in_features != segments[0].in_features for s in segments):
            raise ValueError(f"segments must share in_features, got {[s.shape for s in segments]}")
        self.batch_gemm = batch_gemm
        # rows up to which the GEMV kernel runs, whatever the batch GEMM (the fused decode step takes the same bound):
        # beside bf16 it stopped at 10 rows until `bench step` on a 2-core AVX512-BF16 EPYC (Zen 4), 2026-12-08, put
        # the fused GEMV step at 16 sequences at 25.5 ms (default model) and 32.7 (SmolLM2 Q4_K_M) against the bf16
        # module path's 46 and 48 ms
        self.gemv_max_rows = GEMV_MAX_ROWS
        # batch_gemm bf16's copy, made on first use; not a buffer: the blocks are the weight
        self._weight_bf16: torch.Tensor | None = None
        self.in_features = segments[0].in_features
        self.out_features = sum(s.out_features for s in segments)
        self.qtype = int(
            segments[0].qtype
        )  # a plain int: passed to the kernel on every call (the first segment's)
        self.qtypes = tuple(int(s.qtype) for s in segments)  # each segment's format
        self.act_q8 = act_q8
        # segment 0 is `blocks` (a one-format weight's only one), segment i > 0 `blocks{i}`
        self._buffer_names = tuple(f"blocks{i}" if i else "blocks" for i in range(len(segments)))
        for name, segment in zip(self._buffer_names, segments, strict=True):
            self.register_buffer(name, segment.blocks)
        self._args: tuple[tuple[torch.Tensor, int, int], ...] | None = (
            None  # segment_args of the buffers, cached
        )
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.kernel = load_kernel()

    @property
    def segments(self) -> tuple[QuantWeight, ...]:
        """The weight's segments in row order (one for a one-format weight)."""
        return tuple(
            QuantWeight(QuantType(q), getattr(self, name), self.in_features)
            for name, q in zip(self._buffer_names, self.qtypes, strict=True)
        )

    def _segment_args(self) -> tuple[tuple[torch.Tensor, int, int], ...]:
        """segment_args of the buffers, made once (a decode step calls each linear once a token)."""
        if self._args is None:
            self._args = segment_args(self.segments)
        return self._args

    def _apply(self, *args: Any, **kwargs: Any) -> QuantLinear:
        self._args = None  # .to() and the like may replace the buffers
        return super()._apply(*args, **kwargs)

    @property
    def weight_q(self) -> QuantWeight:
        """The weight's blocks, as a QuantWeight (a one-format weight only: see `segments`)."""
        assert len(self.qtypes) == 1, f"{len(self.qtypes)} segments: use .segments"
        return QuantWeight(QuantType(self.qtype), self.blocks, self.in_features)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight as fp32 [out, in] (for checks and fallbacks)."""
        return torch.cat([dequantize_torch(s) for s in self.segments])

    def extra_repr(self) -> str:
        formats = "+".join(QuantType(q).name for q in self.qtypes)
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, qtype={formats}, "
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
            if len(self.qtypes) == 1:  # the decode step's ~120 calls: no Python work beyond the kernel call
                return self.kernel.linear_rows(
                    x, self.blocks, self.qtype, self.in_features, self.bias, self.act_q8
                )
            return self.kernel.linear_segments(
                x, self._segment_args(), self.in_features, self.out_features, self.bias, self.act_q8
            )
        segments = self.segments
        if self.kernel is None or x.device.type != "cpu":
            return quant_linear_torch(x, segments, self.bias)
        x2 = x.reshape(-1, self.in_features)  # [rows, in]
        x2 = x2.float() if x2.stride(-1) == 1 else x2.float().contiguous()
        bias = None if self.bias is None else self.bias.float()
        if x2.shape[0] <= self.gemv_max_rows:
            y = self.kernel.linear(x2, segments, bias, act_q8=self.act_q8)
        elif self.batch_gemm == "bf16":
            if self._weight_bf16 is None:
                parts = [self.kernel.dequantize(s).to(torch.bfloat16) for s in segments]
                self._weight_bf16 = parts[0] if len(parts) == 1 else torch.cat(parts)
            y = F.linear(x2.to(torch.bfloat16), self._weight_bf16).float()
            if bias is not None:
                y += bias
        elif self.batch_gemm == "int8":
            y = self.kernel.gemm_q8(x2, segments, bias)
        else:
            y = self.kernel.gemm(x2, segments, bias)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

"""Fused CPU ops of the Llama family (fused_ops.c, via ctypes), for bf16 and fp32 activations.

Torch runs add + RMSNorm, SiLU * up and RoPE as several ops each (RMSNorm alone is ~8): a pass over memory per op,
in bf16 a rounding per op, and at a decode batch a fixed dispatch cost per op that outweighs the arithmetic
(30 layers x ~20 small ops a token). The fused ops make one pass and one call each. In fp32 they agree with the
torch ops to rounding (the sum of squares is taken in a different order); the parity tests pin both.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from engine.native.build import load_library

SOURCE = Path(__file__).with_name("fused_ops.c")
SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)


class CpuOps:
    """The compiled ops; each checks its arguments and writes results in its inputs' dtype."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        signatures = {
            "add_rms_norm": [ptr, i64, ptr, i64, ptr, ptr, i64, i32, i32, f32, i32],
            "silu_mul": [ptr, i64, ptr, i64, i32, i32, i32],
            "rope": [ptr, i64, i64, ptr, ptr, i64, i32, i32, i32, i32],
        }
        self._fns: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}
        for name, argtypes in signatures.items():
            for dtype, suffix in ((torch.bfloat16, ""), (torch.float32, "_f32")):
                fn = getattr(lib, name + suffix)
                fn.argtypes, fn.restype = argtypes, None
                self._fns[name, dtype] = fn
        self._argmax = lib.argmax_rows_f32
        self._argmax.argtypes, self._argmax.restype = [ptr, i64, i32, i32, ptr, i32], None

    @staticmethod
    def supports(x: torch.Tensor) -> bool:
        """Whether the ops apply to activations like x: bf16 or fp32 on the CPU."""
        return x.dtype in SUPPORTED_DTYPES and x.device.type == "cpu"

    def add_rms_norm_(
        self,
        residual: torch.Tensor,  # [T, H], unit stride over H; updated in place
        delta: torch.Tensor | None,  # [T, H] or None, residual's dtype
        weight: torch.Tensor,  # [H], residual's dtype
        eps: float,
    ) -> torch.Tensor:
        """residual += delta (in place; rounded once in bf16), then RMSNorm(residual) * weight as a new tensor."""
        rows, dim = residual.shape
        assert residual.stride(1) == 1 and weight.is_contiguous() and weight.shape == (dim,)
        tensors = (residual, weight) if delta is None else (residual, delta, weight)
        assert all(self.supports(t) and t.dtype == residual.dtype for t in tensors), "one bf16/fp32 CPU dtype"
        if delta is not None:
            assert delta.shape == residual.shape and delta.stride(1) == 1
        out = torch.empty((rows, dim), dtype=residual.dtype)
        self._fns["add_rms_norm", residual.dtype](
            residual.data_ptr(),
            residual.stride(0),
            None if delta is None else delta.data_ptr(),
            0 if delta is None else delta.stride(0),
            weight.data_ptr(),
            out.data_ptr(),
            out.stride(0),
            rows,
            dim,
            eps,
            torch.get_num_threads(),
        )
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up = [gate | up] of shape [T, 2I]; returns [T, I]."""
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        assert self.supports(gate_up) and gate_up.stride(1) == 1 and gate_up.shape[1] == 2 * width
        out = torch.empty((rows, width), dtype=gate_up.dtype)
        self._fns["silu_mul", gate_up.dtype](
            gate_up.data_ptr(),
            gate_up.stride(0),
            out.data_ptr(),
            out.stride(0),
            rows,
            width,
            torch.get_num_threads(),
        )
        return out

    def rope_(self, x: torch.Tensor, positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, H, D] in place by table[positions] (llama.rope_cos_sin's [max_pos, 2, D] layout)."""
        rows, num_heads, head_dim = x.shape
        assert self.supports(x) and table.dtype == x.dtype and x.stride(2) == 1 and head_dim % 2 == 0
        assert table.is_contiguous() and table.shape[1:] == (2, head_dim)
        assert positions.dtype == torch.int64 and positions.is_contiguous() and positions.shape == (rows,)
        self._fns["rope", x.dtype](
            x.data_ptr(),
            x.stride(0),
            x.stride(1),
            positions.data_ptr(),
            table.data_ptr(),
            table.stride(0),
            rows,
            num_heads,
            head_dim,
            torch.get_num_threads(),
        )
        return x

    def argmax_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Each row's first maximum of fp32 x [N, V], a NaN counting as the maximum: torch.argmax(x, -1) (int32)."""
        assert x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and x.stride(1) == 1
        out = torch.empty(x.shape[0], dtype=torch.int32)
        self._argmax(
            x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr(), torch.get_num_threads()
        )
        return out


def load_cpu_ops() -> CpuOps | None:
    """The compiled ops for this machine (built on first use); None where they cannot be built or are disabled."""
    lib = load_library(SOURCE)
    return None if lib is None else CpuOps(lib)

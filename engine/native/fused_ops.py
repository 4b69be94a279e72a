"""Fused bf16 CPU ops of the Llama family (fused_ops.c, via ctypes).

Torch runs add + RMSNorm, SiLU * up and RoPE as several bf16 ops each (RMSNorm alone is ~8), with a pass over
memory and a rounding per op; at a decode batch every op is also a fixed dispatch cost. The model uses the fused
ops only for bf16 tensors on the CPU (`supports`); fp32 keeps the torch ops, whose results the parity tests pin.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from engine.native.build import load_library

SOURCE = Path(__file__).with_name("fused_ops.c")


class CpuOps:
    """The compiled ops; each checks its arguments and writes bf16 results."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        self._add_rms_norm = lib.add_rms_norm
        self._add_rms_norm.argtypes = [ptr, i64, ptr, i64, ptr, ptr, i64, i32, i32, f32, i32]
        self._silu_mul = lib.silu_mul
        self._silu_mul.argtypes = [ptr, i64, ptr, i64, i32, i32, i32]
        self._rope = lib.rope
        self._rope.argtypes = [ptr, i64, i64, ptr, ptr, i64, i32, i32, i32, i32]
        for fn in (self._add_rms_norm, self._silu_mul, self._rope):
            fn.restype = None

    @staticmethod
    def supports(x: torch.Tensor) -> bool:
        """Whether the ops apply to activations like x: bf16 on the CPU."""
        return x.dtype == torch.bfloat16 and x.device.type == "cpu"

    def add_rms_norm_(
        self,
        residual: torch.Tensor,  # [T, H] bf16, unit stride over H; updated in place
        delta: torch.Tensor | None,  # [T, H] bf16 or None
        weight: torch.Tensor,  # [H] bf16
        eps: float,
    ) -> torch.Tensor:
        """residual += delta (in place, rounded to bf16), then RMSNorm(residual) * weight as a new tensor."""
        rows, dim = residual.shape
        assert residual.stride(1) == 1 and weight.is_contiguous() and weight.shape == (dim,)
        tensors = (residual, weight) if delta is None else (residual, delta, weight)
        assert all(self.supports(t) for t in tensors), "bf16 CPU tensors only"
        if delta is not None:
            assert delta.shape == residual.shape and delta.stride(1) == 1
        out = torch.empty((rows, dim), dtype=residual.dtype)
        self._add_rms_norm(
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
        """silu(gate) * up for gate_up = [gate | up] of shape [T, 2I] bf16; returns [T, I]."""
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        assert self.supports(gate_up) and gate_up.stride(1) == 1 and gate_up.shape[1] == 2 * width
        out = torch.empty((rows, width), dtype=gate_up.dtype)
        self._silu_mul(
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
        """Rotate x [T, H, D] bf16 in place by table[positions] (llama.rope_cos_sin's [max_pos, 2, D] layout)."""
        rows, num_heads, head_dim = x.shape
        assert self.supports(x) and self.supports(table) and x.stride(2) == 1 and head_dim % 2 == 0
        assert table.is_contiguous() and table.shape[1:] == (2, head_dim)
        assert positions.dtype == torch.int64 and positions.is_contiguous() and positions.shape == (rows,)
        self._rope(
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


def load_cpu_ops() -> CpuOps | None:
    """The compiled ops for this machine (built on first use); None where they cannot be built or are disabled."""
    lib = load_library(SOURCE)
    return None if lib is None else CpuOps(lib)

"""The CPU's float linears, kept behind one class: oneDNN-prepacked bf16 weights (torch's private mkldnn ops), and
fp32 decode rows through our own GEMV (dense_gemv.c)."""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from engine.native.dense_gemv import DenseGemv, load_dense_gemv

PACK_BATCH_HINT = 64  # rows oneDNN tunes a prepacked weight's blocking for: a decode batch


@cache
def bf16_prepack_supported() -> bool:
    """Whether oneDNN can prepack bf16 weights on this CPU (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), PACK_BATCH_HINT)
    except (AttributeError, RuntimeError):  # a torch build without the ops, or a CPU without the instructions
        return False
    return True


@cache
def dense_gemv() -> DenseGemv | None:
    """The fp32 GEMV, built and loaded on first use; None without native code."""
    return load_dense_gemv()


class Linear(nn.Linear):
    """nn.Linear that can run from a oneDNN-prepacked copy of its weight (bf16 on CPU), and whose fp32 calls of a
    few rows (decode) take the native GEMV.

    F.linear reorders a bf16 weight into oneDNN's blocked layout on every call; at decode batch sizes that reorder
    is a large share of the call (SmolLM2's 30 layers of linears at 64 rows, one core: ~79 -> ~44-56 ms; no
    slower at 512 rows). In fp32 at one row it streams the weight at ~6 GB/s on two AVX2 cores; the GEMV at
    15-30 GB/s (SmolLM2's tied 49,152 x 576 head: 18.9 -> 7.4 ms).
    """

    packed: torch.Tensor | None = None

    def pack(self) -> bool:
        """Prepack the current weight (call after the weights are final); False where it does not apply."""
        weight = self.weight.detach()
        if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not bf16_prepack_supported():
            return False
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            gemv = dense_gemv()
            if gemv is not None and gemv.applies(x, self.weight):
                return gemv.linear(x, self.weight, self.bias)
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

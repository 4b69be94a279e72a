"""Rotary position embeddings: the inverse frequencies (default, linear, Llama 3 scaling), the cos/sin table, and
the per-step inputs every layer shares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.models.llama import ModelArgs
    from engine.native.fused_ops import CpuOps


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in fp32, with linear or Llama 3 scaling applied.

    A GGUF Llama 3 carries its scaling as per-frequency divisors (`rope_freq_factors`, llama.cpp's rope_freqs),
    computed by llama.cpp's converter from the HF llama3 parameters, so the table equals the HF one's."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if args.rope_freq_factors:
        inv_freq = inv_freq / torch.tensor(args.rope_freq_factors, dtype=torch.float32)
    scaling = dict(args.rope_scaling)
    if args.rope_type == "linear":
        return inv_freq / scaling["factor"]
    if args.rope_type == "llama3":
        factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(args: ModelArgs) -> torch.Tensor:
    """[max_seq_len, 2, head_dim]: cos and sign-folded sin (-sin, sin) per position, computed in fp32."""
    freqs = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float32), rope_inv_freq(args))
    cos, sin = freqs.cos(), freqs.sin()
    return torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by cos/sin [T, 1, D] from rope_cos_sin (HF's rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((x[..., half:], x[..., :half]), dim=-1)  # times (-sin, sin): rotate_half(x) * sin
    return torch.addcmul(x * cos, rotated, sin)


@dataclass(frozen=True)
class RopeInputs:
    """A step's rotary inputs, gathered once for every layer."""

    positions: torch.Tensor  # [T] int64
    table: torch.Tensor  # [max_seq_len, 2, D] from rope_cos_sin, in the model's dtype
    cos: torch.Tensor  # [T, 1, D]
    sin: torch.Tensor  # [T, 1, D], sign-folded

    @classmethod
    def gather(cls, table: torch.Tensor, positions: torch.Tensor) -> RopeInputs:
        cos_sin = table[positions]  # [T, 2, D]
        return cls(positions, table, cos_sin[:, 0:1], cos_sin[:, 1:2])

    def rotate(self, x: torch.Tensor, ops: CpuOps | None) -> torch.Tensor:
        """x [T, H, D] rotated: in place by the fused op where it applies, else into a new tensor."""
        if ops is not None and ops.supports(x):
            return ops.rope_(x, self.positions, self.table)
        return apply_rope(x, self.cos, self.sin)

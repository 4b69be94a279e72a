"""GGUF's 32-weight block formats (Q4_0, Q4_1, Q8_0) as torch tensors, with a pure-torch dequantize and linear.

A quantized weight [out, in] is kept as its raw GGUF bytes, one row of blocks per output feature:
`blocks` is uint8 [out, in / 32 * block_bytes]. Rows are independent, so rows can be permuted, sliced and
concatenated (q/k un-permutation, fused qkv and gate/up) without touching a block.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch
import torch.nn.functional as F

BLOCK_SIZE = 32  # weights per block in every supported format


class QuantType(IntEnum):
    """The supported block formats, numbered as ggml numbers them (gguf.GGMLQuantizationType)."""

    Q4_0 = 2  # fp16 d, 16 bytes of nibbles: w = d * (q - 8)
    Q4_1 = 3  # fp16 d, fp16 m, 16 bytes of nibbles: w = d * q + m
    Q8_0 = 8  # fp16 d, 32 int8: w = d * q

    @property
    def block_bytes(self) -> int:
        """Bytes per block of 32 weights."""
        return {QuantType.Q4_0: 18, QuantType.Q4_1: 20, QuantType.Q8_0: 34}[self]

    @property
    def scale_bytes(self) -> int:
        """Bytes of fp16 scale (and min) at the start of each block."""
        return 4 if self is QuantType.Q4_1 else 2


@dataclass(frozen=True)
class QuantWeight:
    """A [out_features, in_features] weight in one block format: raw GGUF blocks, one row per output feature."""

    qtype: QuantType
    blocks: torch.Tensor  # [out_features, in_features / 32 * block_bytes] uint8, contiguous
    in_features: int

    def __post_init__(self) -> None:
        if self.in_features % BLOCK_SIZE != 0:
            raise ValueError(
                f"in_features ({self.in_features}) must be a multiple of {BLOCK_SIZE} for {self.qtype.name}"
            )
        row_bytes = self.in_features // BLOCK_SIZE * self.qtype.block_bytes
        assert self.blocks.dtype == torch.uint8 and self.blocks.dim() == 2, "blocks must be 2-D uint8"
        assert self.blocks.shape[1] == row_bytes, (
            f"{self.blocks.shape[1]} bytes per row, expected {row_bytes}"
        )
        assert self.blocks.is_contiguous(), "blocks must be contiguous"

    @property
    def out_features(self) -> int:
        """Rows of the weight."""
        return self.blocks.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features), as nn.Linear's weight."""
        return (self.out_features, self.in_features)

    def select_rows(self, index: torch.Tensor) -> QuantWeight:
        """The weight made of rows `index` (int64 [n]) in that order; blocks are moved whole."""
        return QuantWeight(self.qtype, self.blocks[index].contiguous(), self.in_features)

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight:
        """The parts stacked along the output dimension (fused q/k/v or gate/up); one format and width only."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.in_features != first.in_features for p in parts):
            raise ValueError(f"cannot fuse {[(p.qtype.name, p.in_features) for p in parts]}: formats differ")
        return QuantWeight(first.qtype, torch.cat([p.blocks for p in parts]), first.in_features)


def dequantize_torch(weight: QuantWeight) -> torch.Tensor:
    """The weight as fp32 [out, in], computed as gguf.quants.dequantize does."""
    qtype, rows = weight.qtype, weight.out_features
    blocks = weight.blocks.view(rows, -1, qtype.block_bytes)  # [out, num_blocks, block_bytes]
    d = blocks[..., :2].contiguous().view(torch.float16).float()  # [out, num_blocks, 1]
    quants = blocks[..., qtype.scale_bytes :]
    if qtype is QuantType.Q8_0:
        q = quants.contiguous().view(torch.int8).float()
        return (d * q).view(rows, -1)
    q = torch.cat([quants & 0x0F, quants >> 4], dim=-1).float()  # low nibbles are weights 0..15
    if qtype is QuantType.Q4_0:
        return (d * (q - 8)).view(rows, -1)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float()
    return (d * q + m).view(rows, -1)


def quant_linear_torch(
    x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ dequantize(weight)^T (+ bias) in fp32, returned in x's dtype: the twin of the compiled kernel."""
    y = F.linear(x.float(), dequantize_torch(weight), None if bias is None else bias.float())
    return y.to(x.dtype)

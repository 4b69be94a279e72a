"""GGUF's block formats as torch tensors, with a dequantize and linear in torch (the compiled kernels' twins).

A quantized weight [out, in] is kept as its raw GGUF bytes, one row of blocks per output feature:
`blocks` is uint8 [out, in / block_weights * block_bytes]. Rows are independent, so rows can be permuted, sliced and
concatenated (q/k un-permutation, fused qkv and gate/up) without touching a block. Q4_0/Q4_1/Q8_0 are dequantized
here in torch; the other formats (Q5_0, Q5_1, IQ4_NL of 32 weights; the K-quants and IQ4_XS of 256) by
gguf.quants.dequantize, the reference the kernels are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import groupby

import torch
import torch.nn.functional as F

BLOCK_SIZE = 32  # weights per block of Q4_0/Q4_1/Q8_0 (and Q5_0/Q5_1/IQ4_NL)
SUPER_BLOCK_SIZE = 256  # weights per super-block of the K-quants and IQ4_XS


class QuantType(IntEnum):
    """The block formats the kernels multiply, numbered as ggml numbers them (gguf.GGMLQuantizationType)."""

    Q4_0 = 2  # fp16 d, 16 bytes of nibbles: w = d * (q - 8)
    Q4_1 = 3  # fp16 d, fp16 m, 16 bytes of nibbles: w = d * q + m
    Q5_0 = 6  # fp16 d, 4 bytes of fifth bits, 16 of nibbles: w = d * (q - 16)
    Q5_1 = 7  # Q5_0 with an fp16 minimum: w = d * q + m
    Q8_0 = 8  # fp16 d, 32 int8: w = d * q
    Q3_K = 11  # 256 weights: 3 bits, 16 6-bit scales, fp16 d
    Q4_K = 12  # 256 weights: 4 bits, 8 sub-blocks with 6-bit scale and minimum, fp16 d and dmin
    Q5_K = 13  # Q4_K plus a fifth bit
    Q6_K = 14  # 256 weights: 6 bits, 16 int8 scales, fp16 d
    IQ4_NL = 20  # fp16 d, 16 bytes of nibbles indexing 16 non-uniform levels
    IQ4_XS = 23  # 256 weights: IQ4_NL's levels, 8 sub-blocks with 6-bit scales
    # ours, in no file: Q4_K's blocks repacked at load into groups of 8 interleaved rows (148 bytes a row and
    # super-block; engine/native/quant/q4k_r8.h); a weight of it has out_features % 8 == 0
    Q4_K_R8 = 112

    @property
    def in_files(self) -> bool:
        """A GGUF tensor type (every format but the repacked ones, which the loader makes)."""
        return self is not QuantType.Q4_K_R8

    @property
    def file_type(self) -> QuantType:
        """The file format a repacked one is made from (itself for a file format)."""
        return QuantType.Q4_K if self is QuantType.Q4_K_R8 else self

    @property
    def block_weights(self) -> int:
        """Weights per block: 32, or 256 for the super-block formats."""
        return BLOCK_SIZE if self in _BLOCKS_OF_32 else SUPER_BLOCK_SIZE

    @property
    def block_bytes(self) -> int:
        """Bytes per block of block_weights weights."""
        return _BLOCK_BYTES[self]

    @property
    def legacy(self) -> bool:
        """Q4_0/Q4_1/Q8_0: the formats with kernels of their own (and an int8 GEMM tuned for them)."""
        return self in (QuantType.Q4_0, QuantType.Q4_1, QuantType.Q8_0)

    @property
    def fp16_offsets(self) -> tuple[int, ...]:
        """Byte offsets of the block's fp16 fields: d, and dmin / m where it has one."""
        return _FP16_OFFSETS[self]

    @property
    def scale_bytes(self) -> int:
        """Bytes of fp16 scale (and min) at the start of each block."""
        return 4 if self is QuantType.Q4_1 else 2


_FP16_OFFSETS = {
    QuantType.Q4_0: (0,),
    QuantType.Q4_1: (0, 2),
    QuantType.Q5_0: (0,),
    QuantType.Q5_1: (0, 2),
    QuantType.Q8_0: (0,),
    QuantType.Q3_K: (108,),
    QuantType.Q4_K: (0, 2),
    QuantType.Q5_K: (0, 2),
    QuantType.Q6_K: (208,),
    QuantType.IQ4_NL: (0,),
    QuantType.IQ4_XS: (0,),
    QuantType.Q4_K_R8: (),  # 8 rows' d, then their dmin, at the start of each group's block
}
_BLOCKS_OF_32 = frozenset(
    (QuantType.Q4_0, QuantType.Q4_1, QuantType.Q5_0, QuantType.Q5_1, QuantType.Q8_0, QuantType.IQ4_NL)
)
_BLOCK_BYTES = {
    QuantType.Q4_0: 18,
    QuantType.Q4_1: 20,
    QuantType.Q5_0: 22,
    QuantType.Q5_1: 24,
    QuantType.Q8_0: 34,
    QuantType.Q3_K: 110,
    QuantType.Q4_K: 144,
    QuantType.Q5_K: 176,
    QuantType.Q6_K: 210,
    QuantType.IQ4_NL: 18,
    QuantType.IQ4_XS: 136,
    QuantType.Q4_K_R8: 148,
}
FILE_TYPES = tuple(
    q for q in QuantType if q.in_files
)  # the formats a GGUF tensor may be in and stay in blocks
R8_ROWS = 8  # rows a group of Q4_K_R8 interleaves


@dataclass(frozen=True)
class QuantWeight:
    """A [out_features, in_features] weight in one block format: raw GGUF blocks, one row per output feature."""

    qtype: QuantType
    blocks: torch.Tensor  # [out_features, in_features / block_weights * block_bytes] uint8, contiguous
    in_features: int

    def __post_init__(self) -> None:
        per_block = self.qtype.block_weights
        if self.in_features % per_block != 0:
            raise ValueError(
                f"in_features ({self.in_features}) must be a multiple of {per_block} for {self.qtype.name}"
            )
        row_bytes = self.in_features // per_block * self.qtype.block_bytes
        assert self.blocks.dtype == torch.uint8 and self.blocks.dim() == 2, "blocks must be 2-D uint8"
        assert self.blocks.shape[1] == row_bytes, (
            f"{self.blocks.shape[1]} bytes per row, expected {row_bytes}"
        )
        assert self.blocks.is_contiguous(), "blocks must be contiguous"
        if self.qtype is QuantType.Q4_K_R8 and self.out_features % R8_ROWS:
            raise ValueError(f"Q4_K_R8 holds groups of {R8_ROWS} rows, not {self.out_features}")

    @property
    def out_features(self) -> int:
        """Rows of the weight."""
        return self.blocks.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """(out_features, in_features), as nn.Linear's weight."""
        return (self.out_features, self.in_features)

    def select_rows(self, index: torch.Tensor) -> QuantWeight:
        """The weight made of rows `index` (int64 [n]) in that order; blocks are moved whole (a Q4_K_R8 weight's
        rows as Q4_K: a row of it is a lane of its group)."""
        if self.qtype is QuantType.Q4_K_R8:
            return unpack_rows8(self).select_rows(index)
        return QuantWeight(self.qtype, self.blocks[index].contiguous(), self.in_features)

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight:
        """The parts stacked along the output dimension (fused q/k/v or gate/up); one format and width only."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.in_features != first.in_features for p in parts):
            raise ValueError(f"cannot fuse {[(p.qtype.name, p.in_features) for p in parts]}: formats differ")
        whole = _adjacent_rows(parts)
        blocks = torch.cat([p.blocks for p in parts]) if whole is None else whole
        return QuantWeight(first.qtype, blocks, first.in_features)


def _adjacent_rows(parts: list[QuantWeight]) -> torch.Tensor | None:
    """The rows of one buffer that `parts` are, in order, back to back (the loader reads a fused linear's parts
    into one buffer: fusing them then copies nothing), else None."""
    first = parts[0].blocks
    storage, end = first.untyped_storage(), first.data_ptr()
    for part in parts:
        if part.blocks.untyped_storage().data_ptr() != storage.data_ptr() or part.blocks.data_ptr() != end:
            return None
        end += part.blocks.numel()
    rows = sum(p.out_features for p in parts)
    return first.new_empty(0).set_(storage, first.storage_offset(), (rows, first.shape[1]))


def stack_segments(parts: list[QuantWeight]) -> tuple[QuantWeight, ...]:
    """The parts stacked along the output dimension as segments: each run of one format concatenated into one
    QuantWeight (llama-quantize's Q4_K_M gives q/k Q4_K and v Q6_K in some layers: two segments).
    One segment when every part has the same format."""
    if any(p.in_features != parts[0].in_features for p in parts):
        raise ValueError(f"cannot stack widths {[p.in_features for p in parts]}: in_features differ")
    runs = [list(run) for _, run in groupby(parts, key=lambda p: p.qtype)]
    return tuple(run[0] if len(run) == 1 else QuantWeight.cat(run) for run in runs)


def _q4k_scale_bytes(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q4_K block's 12 scale bytes [..., 12] (uint8) -> its 8 sub-blocks' 6-bit scales and minimums [..., 8]."""
    q = scales.to(torch.int32)
    low_sc, low_mn = q[..., 0:4] & 63, q[..., 4:8] & 63
    high_sc = (q[..., 8:12] & 0x0F) | ((q[..., 0:4] >> 6) << 4)
    high_mn = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return torch.cat([low_sc, high_sc], -1).to(torch.uint8), torch.cat([low_mn, high_mn], -1).to(torch.uint8)


def _q4k_pack_scales(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """_q4k_scale_bytes inverted: 6-bit scales and minimums [..., 8] -> the 12 scale bytes [..., 12]."""
    sc, mn = sc.to(torch.int32), mn.to(torch.int32)
    first = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    second = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    third = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    return torch.cat([first, second, third], -1).to(torch.uint8)


def repack_rows8(weight: QuantWeight) -> QuantWeight:
    """A Q4_K weight (out_features % 8 == 0) as Q4_K_R8: the twin of the compiled `repack_q4k_r8` (the layout:
    engine/native/quant/q4k_r8.h)."""
    assert weight.qtype is QuantType.Q4_K, f"only Q4_K repacks, not {weight.qtype.name}"
    out, nb = weight.out_features, weight.in_features // SUPER_BLOCK_SIZE
    if out % R8_ROWS:
        raise ValueError(f"Q4_K_R8 holds groups of {R8_ROWS} rows, not {out}")
    blocks = weight.blocks.view(out // R8_ROWS, R8_ROWS, nb, -1).transpose(1, 2)  # [groups, nb, row, 144]
    sc, mn = _q4k_scale_bytes(blocks[..., 4:16])  # [groups, nb, row, 8]
    qs = (
        blocks[..., 16:].reshape(*blocks.shape[:3], 4, 4, 8).permute(0, 1, 3, 4, 2, 5)
    )  # [g, nb, p, j, row, k]
    packed = torch.cat(
        [
            blocks[..., 0:2].flatten(2),  # the 8 rows' d
            blocks[..., 2:4].flatten(2),  # their dmin
            sc.transpose(2, 3).flatten(2),  # [sub-block][row]
            mn.transpose(2, 3).flatten(2),
            qs.flatten(2),
        ],
        -1,
    )  # [groups, nb, 1184]
    return QuantWeight(QuantType.Q4_K_R8, packed.reshape(out, -1).contiguous(), weight.in_features)


def unpack_rows8(weight: QuantWeight) -> QuantWeight:
    """repack_rows8 inverted: a Q4_K_R8 weight as the Q4_K rows it was made of, byte for byte."""
    assert weight.qtype is QuantType.Q4_K_R8
    out, nb = weight.out_features, weight.in_features // SUPER_BLOCK_SIZE
    groups = weight.blocks.view(out // R8_ROWS, nb, -1)  # [groups, nb, 1184]
    d = groups[..., 0:16].reshape(*groups.shape[:2], R8_ROWS, 2)
    dmin = groups[..., 16:32].reshape(*groups.shape[:2], R8_ROWS, 2)
    sc = groups[..., 32:96].reshape(*groups.shape[:2], 8, R8_ROWS).transpose(2, 3)  # [g, nb, row, sub-block]
    mn = groups[..., 96:160].reshape(*groups.shape[:2], 8, R8_ROWS).transpose(2, 3)
    qs = groups[..., 160:].reshape(*groups.shape[:2], 4, 4, R8_ROWS, 8).permute(0, 1, 4, 2, 3, 5)
    blocks = torch.cat([d, dmin, _q4k_pack_scales(sc, mn), qs.flatten(3)], -1)  # [g, nb, row, 144]
    rows = blocks.transpose(1, 2).reshape(out, -1).contiguous()
    return QuantWeight(QuantType.Q4_K, rows, weight.in_features)


def dequantize_torch(weight: QuantWeight) -> torch.Tensor:
    """The weight as fp32 [out, in], computed as gguf.quants.dequantize does."""
    if weight.qtype is QuantType.Q4_K_R8:
        weight = unpack_rows8(weight)
    qtype, rows = weight.qtype, weight.out_features
    if not qtype.legacy:
        from gguf import GGMLQuantizationType, quants

        values = quants.dequantize(weight.blocks.numpy(), GGMLQuantizationType(int(qtype)))
        return torch.from_numpy(values).float().reshape(rows, weight.in_features)
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


def dequantize_rows_torch(weight: QuantWeight, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` (int64 [n]) of the weight as fp32 [n, in]: the twin of the compiled `dequantize_gather` (the
    embedding's rows of a step, gathered from its blocks)."""
    return dequantize_torch(weight.select_rows(index))


def quant_linear_torch(
    x: torch.Tensor, weight: QuantWeight | Sequence[QuantWeight], bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ dequantize(weight)^T (+ bias) in fp32, returned in x's dtype: the twin of the compiled kernel (a weight
    of segments: theirs stacked by rows)."""
    if isinstance(weight, QuantWeight):
        w = dequantize_torch(weight)
    else:
        w = torch.cat([dequantize_torch(s) for s in weight])
    y = F.linear(x.float(), w, None if bias is None else bias.float())
    return y.to(x.dtype)

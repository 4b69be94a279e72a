"""GGUF tensors read with plain file reads straight into the buffers the model keeps.

Reading through the reader's memory map would leave every touched page of the file mapped into the process, so the
resident size would count the file once more (page cache) beside our own copy; `os.preadv` into the final buffer
reads each byte once and maps nothing. Fused linears (q/k/v, gate/up) get one buffer, each part read into its rows;
llama's permuted q/k rows go through a small temporary (one part's bytes) to be put back in HF order. Tensors that
become float are read and converted a slice of rows at a time, so no whole-tensor float temporary exists either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.models.quantized import QuantType, QuantWeight, dequantize_torch, load_quant_kernel
from engine.native.huge_pages import empty_on_huge_pages
from engine.native.quant_format import R8_ROWS, repack_rows8

FLOAT_FILE_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.int16,
}  # BF16 read as int16, viewed later
CHUNK_FLOAT_BYTES = 32 << 20  # fp32 bytes converted per slice of rows


@dataclass(frozen=True)
class FileTensor:
    """Where one tensor lies in the file and what it is: its GGUF type name, shape in HF order (rows first)."""

    name: str  # GGUF name
    kind: str  # GGMLQuantizationType name: F32, Q4_K, ...
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))

    @property
    def qtype(self) -> QuantType | None:
        """The block format when our kernels multiply it, else None (float, or a block format without a kernel)."""
        return QuantType[self.kind] if self.kind in QuantType.__members__ else None


def file_tensors(reader: Any) -> dict[str, FileTensor]:
    """Every tensor of a GGUFReader by GGUF name (nothing is read: offsets and sizes only)."""
    return {
        t.name: FileTensor(
            t.name,
            t.tensor_type.name,
            tuple(int(d) for d in reversed(t.shape.tolist())),  # GGUF lists dims innermost first
            int(t.data_offset),
            int(t.n_bytes),
        )
        for t in reader.tensors
    }


def pread_into(fd: int, offset: int, out: torch.Tensor) -> None:
    """Fill the contiguous CPU tensor `out` with the file's bytes at `offset` (looping over short reads)."""
    assert out.is_contiguous() and out.device.type == "cpu"
    view = memoryview(out.view(torch.uint8).numpy()).cast("B") if out.numel() else memoryview(b"")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"GGUF file ended {len(view) - done} bytes early at offset {offset + done}")
        done += n


def read_block_group(
    fd: int,
    parts: list[FileTensor],
    row_orders: list[torch.Tensor | None],
    staging: torch.Tensor | None = None,
    *,
    rows8: bool = False,
    unpacked: torch.Tensor | None = None,
) -> list[QuantWeight]:
    """Parts of one block format read into one [rows, row bytes] buffer, each into its rows (in `row_orders[i]`'s
    order when given: HF row r is the file's row order[r], read first into `staging`, flat uint8 of at least the
    part's bytes); the returned weights are views of that buffer, so QuantWeight.cat of them in order takes the
    buffer as is. One staging buffer for the whole load: a temporary per q/k, freed between the buffers that stay,
    would leave that many holes in the heap that malloc cannot give back (~0.3 GB at 8B).
    rows8: Q4_K parts (whole groups of 8 rows each: see `repacks`) are read so into `unpacked` (flat uint8, the same
    for the whole load) and repacked into the buffer as Q4_K_R8: no copy of the file's blocks stays."""
    qtype = parts[0].qtype
    assert qtype is not None and all(p.qtype is qtype and p.row_bytes == parts[0].row_bytes for p in parts)
    if rows8:
        assert repacks(parts), f"{[p.name for p in parts]} are not Q4_K in groups of {R8_ROWS} rows"
    packed = QuantType.Q4_K_R8 if rows8 else qtype
    width = parts[0].shape[-1]
    # on huge pages: a decode step streams every block once (the GEMV's page walks: engine/native/huge_pages.py)
    buffer = empty_on_huge_pages(
        (sum(p.rows for p in parts), width // packed.block_weights * packed.block_bytes), dtype=torch.uint8
    )
    kernel = load_quant_kernel() if rows8 else None
    weights, row = [], 0
    for part, order in zip(parts, row_orders, strict=True):
        rows = buffer[row : row + part.rows]
        if not rows8:
            staging = _read_rows(fd, part, order, rows, staging)
            weights.append(QuantWeight(qtype, rows, width))
        else:
            if unpacked is None or unpacked.numel() < part.nbytes:
                unpacked = torch.empty(part.nbytes, dtype=torch.uint8)
            file_rows = unpacked[: part.nbytes].view(part.rows, part.row_bytes)
            staging = _read_rows(fd, part, order, file_rows, staging)
            q4k = QuantWeight(qtype, file_rows, width)
            if kernel is not None:  # else the torch twin
                weights.append(kernel.repack(q4k, out=rows))
            else:
                rows.copy_(repack_rows8(q4k).blocks)
                weights.append(QuantWeight(packed, rows, width))
        row += part.rows
    return weights


def _read_rows(
    fd: int, part: FileTensor, order: torch.Tensor | None, out: torch.Tensor, staging: torch.Tensor | None
) -> torch.Tensor | None:
    """The part's rows into `out` ([rows, row bytes]), in `order` when given (read first into `staging`, made or
    grown here when short); the staging buffer, for the next part."""
    if order is None:
        pread_into(fd, part.offset, out)
        return staging
    if staging is None or staging.numel() < out.numel():
        staging = torch.empty(out.numel(), dtype=torch.uint8)
    staged = staging[: out.numel()].view(out.shape)
    pread_into(fd, part.offset, staged)
    torch.index_select(staged, 0, order, out=out)
    return staging


def repacks(parts: list[FileTensor]) -> bool:
    """Whether weight_layout rows8 repacks these parts of one buffer: Q4_K, each of whole groups of 8 rows."""
    return all(p.qtype is QuantType.Q4_K and p.rows % R8_ROWS == 0 for p in parts)


def dequantize_fp32(weight: QuantWeight) -> torch.Tensor:
    """The weight as fp32 [out, in]: by the compiled kernel where it is built (gguf.quants' numpy takes ~10x longer:
    seconds for a 128k-row embedding), else by the torch twin."""
    kernel = load_quant_kernel()
    return dequantize_torch(weight) if kernel is None else kernel.dequantize(weight)


def dequantize_into(weight: QuantWeight, target: torch.Tensor) -> None:
    """The blocks dequantized into `target` [out, in]: by the kernel straight into an fp32 CPU target, else a slice
    of rows at a time (no whole fp32 temporary)."""
    kernel = load_quant_kernel()
    if kernel is not None and target.dtype == torch.float32 and target.device.type == "cpu":
        kernel.dequantize(weight, out=target)
        return
    step = max(
        R8_ROWS, CHUNK_FLOAT_BYTES // (4 * weight.in_features) // R8_ROWS * R8_ROWS
    )  # whole 8-row groups
    for start in range(0, weight.out_features, step):
        stop = min(weight.out_features, start + step)
        rows = QuantWeight(weight.qtype, weight.blocks[start:stop], weight.in_features)
        target[start:stop].copy_(dequantize_fp32(rows))


def _rows_as_float(tensor: FileTensor, raw: torch.Tensor) -> torch.Tensor:
    """Raw bytes of whole rows [n, row bytes] as float [n, in] (fp32 for block formats, the file's float type)."""
    n, width = raw.shape[0], tensor.shape[-1]
    if tensor.kind in FLOAT_FILE_DTYPES:
        values = torch.from_numpy(raw.numpy().view(FLOAT_FILE_DTYPES[tensor.kind]))
        return (values.view(torch.bfloat16) if tensor.kind == "BF16" else values).reshape(n, width)
    if tensor.qtype is not None:
        return dequantize_fp32(QuantWeight(tensor.qtype, raw, width))
    from gguf import GGMLQuantizationType, quants

    values = quants.dequantize(raw.numpy(), GGMLQuantizationType[tensor.kind])
    return torch.from_numpy(values).reshape(n, width)


def read_float_into(
    fd: int, tensor: FileTensor, target: torch.Tensor, row_order: torch.Tensor | None
) -> None:
    """The tensor converted to `target`'s dtype into `target` (its shape), a slice of rows at a time; with
    `row_order`, target row r is the file's row order[r] (read whole: only llama's q/k, a layer's width)."""
    if tensor.shape != tuple(target.shape):
        raise ValueError(
            f"{tensor.name}: shape {tensor.shape} in the file, the model expects {tuple(target.shape)}"
        )
    rows, row_bytes = tensor.rows, tensor.row_bytes
    flat = target.view(rows, -1)
    if row_order is not None:
        raw = torch.empty(rows, row_bytes, dtype=torch.uint8)
        pread_into(fd, tensor.offset, raw)
        values = _rows_as_float(tensor, raw)
        values = (
            values.reshape(-1)[row_order] if target.dim() == 1 else values[row_order]
        )  # a bias: its elements
        target.copy_(values.view(target.shape))
        return
    step = max(1, CHUNK_FLOAT_BYTES // max(1, 4 * flat.shape[1]))
    kernel = load_quant_kernel() if tensor.qtype is not None and flat.dtype == torch.float32 else None
    raw = torch.empty(min(rows, step), row_bytes, dtype=torch.uint8)  # one staging buffer for every slice
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        part = raw[: stop - start]
        pread_into(fd, tensor.offset + start * row_bytes, part)
        if kernel is not None and flat.device.type == "cpu":  # dequantized straight into the parameter's rows
            kernel.dequantize(QuantWeight(tensor.qtype, part, tensor.shape[-1]), out=flat[start:stop])
        else:
            flat[start:stop].copy_(_rows_as_float(tensor, part).view(stop - start, -1))

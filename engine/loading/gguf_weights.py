"""Which GGUF tensors stay in blocks and which become float, what the float copies cost, and whether they fit.

The model is built on the meta device. Every linear whose parts are all in a format our kernels multiply is read in
blocks (`read_linear_blocks`); only what is left on the meta device after the linears are swapped gets real storage
and is read in float (`float_loads`): norms, biases, the embedding, and linears in a format without a kernel. Such a
linear costs its float bytes, never silently: a WARNING per group of tensors states it, and loading is refused
with the numbers when the machine's available memory would not hold it (`check_fits`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from itertools import groupby

import torch

from engine.core.memory import NotEnoughMemory, available_memory_bytes, human_bytes
from engine.loading.gguf_read import FLOAT_FILE_DTYPES, FileTensor, read_block_group, repacks
from engine.models.llama import LlamaForCausalLM
from engine.models.quantized import EMBEDDING, QuantWeight, fused_linear_sources

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FloatLoad:
    """One file tensor read into (rows of) a float parameter."""

    hf_name: str
    tensor: FileTensor
    param: str  # the model's parameter name
    offset: int  # first row
    rows: int | None  # None: the whole parameter

    def nbytes(self, dtype: torch.dtype) -> int:
        return self.tensor.numel * dtype.itemsize


def linear_block_parts(model: LlamaForCausalLM, tensors: dict[str, FileTensor]) -> list[list[str]]:
    """HF names of each linear's weights that all have a block kernel, grouped by the buffer they are read into:
    each run of a linear's parts in one format is one buffer (fused q/k/v, gate/up: one; a Q4_K_M file's q/k in Q4_K
    beside v in Q6_K: two, the segments of one QuantLinear); then an untied embedding in a block format, which
    stays in blocks too (its rows are gathered from them)."""
    groups: list[list[str]] = []
    for hf_names in fused_linear_sources(model).values():
        parts = [tensors.get(name) for name in hf_names]
        if any(p is None or p.qtype is None for p in parts):
            continue
        runs = groupby(zip(hf_names, parts, strict=True), key=lambda item: (item[1].qtype, item[1].row_bytes))
        groups.extend([name for name, _ in run] for _, run in runs)
    embedding = tensors.get(EMBEDDING)
    if embedding is not None and embedding.qtype is not None and not any(EMBEDDING in g for g in groups):
        groups.append([EMBEDDING])
    return groups


def read_linear_blocks(
    fd: int,
    groups: list[list[str]],
    tensors: dict[str, FileTensor],
    row_orders: dict[str, torch.Tensor],
    *,
    rows8: bool = False,
) -> dict[str, QuantWeight]:
    """The blocks of every group, read from the file into one buffer per group, by HF name. rows8 (weight_layout
    rows8): a linear's group of Q4_K parts in whole groups of 8 rows is repacked as Q4_K_R8 (not the embedding,
    whose rows a step gathers, nor a head tied to it)."""
    weights: dict[str, QuantWeight] = {}
    repacked = [rows8 and EMBEDDING not in names and repacks([tensors[n] for n in names]) for names in groups]
    reordered = [tensors[n].nbytes for names in groups for n in names if n in row_orders]
    staging = torch.empty(max(reordered, default=0), dtype=torch.uint8)  # for every q/k: see read_block_group
    to_repack = [tensors[n].nbytes for names, r in zip(groups, repacked, strict=True) if r for n in names]
    unpacked = torch.empty(max(to_repack, default=0), dtype=torch.uint8)  # a repacked part's file rows
    for names, repack in zip(groups, repacked, strict=True):
        parts = read_block_group(
            fd,
            [tensors[n] for n in names],
            [row_orders.get(n) for n in names],
            staging,
            rows8=repack,
            unpacked=unpacked,
        )
        weights.update(zip(names, parts, strict=True))
    return weights


def float_loads(
    model: LlamaForCausalLM, tensors: dict[str, FileTensor], in_blocks: set[str]
) -> list[FloatLoad]:
    """The file tensors that go into float parameters still on the meta device (those the linears in blocks did not
    take); ValueError for a tensor with no place in the model, or a parameter no tensor covers."""
    params = dict(model.named_parameters())
    loads, covered = [], {}
    for hf_name, tensor in tensors.items():
        slot = None if hf_name in in_blocks else model.weight_slot(hf_name)
        if slot is None:
            continue
        name, offset, rows = slot
        if name not in params:
            if hf_name == EMBEDDING:
                continue  # an embedding module that gathers its rows from the head's blocks
            raise ValueError(f"GGUF tensor {tensor.name!r} ({hf_name}) has no place in this model")
        if not params[name].is_meta:
            continue
        loads.append(FloatLoad(hf_name, tensor, name, offset, rows))
        covered[name] = covered.get(name, 0) + tensor.shape[0]
    missing = [n for n, p in params.items() if p.is_meta and covered.get(n, 0) != p.shape[0]]
    if missing:
        raise ValueError(f"the GGUF file does not cover parameters: {missing[:8]} ({len(missing)} in all)")
    return loads


def float_copies(loads: list[FloatLoad], dtype: torch.dtype, linears: set[str]) -> list[FloatCopy]:
    """Groups of tensors given float storage larger than their bytes in the file (norms and biases, kept as they
    are, are left out), biggest first; blk.N. becomes blk.*. `linears`: the GGUF names of linear weights."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for load in loads:
        if load.nbytes(dtype) <= load.tensor.nbytes:
            continue
        tensor = load.tensor
        if tensor.name not in linears or load.hf_name == EMBEDDING:
            why = ""  # the embedding (gathered in float), or a tensor that is no linear
        elif tensor.qtype is None:
            why = f"no block kernel for {tensor.kind}"
        else:
            why = "a fused linear of mixed formats"
        key = (re.sub(r"^blk\.\d+\.", "blk.*.", tensor.name), tensor.kind, why)
        counts = groups.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += load.nbytes(dtype)
    copies = [
        FloatCopy(pattern, kind, n, nbytes, why) for (pattern, kind, why), (n, nbytes) in groups.items()
    ]
    return sorted(copies, key=lambda c: -c.nbytes)


@dataclass(frozen=True)
class FloatCopy:
    """Tensors of one name pattern and format given float storage: how many, their float bytes, and why a linear
    is in float (empty for the rest)."""

    pattern: str
    kind: str
    count: int
    nbytes: int
    why: str

    def describe(self, dtype: torch.dtype) -> str:
        how = "converted" if self.kind in FLOAT_FILE_DTYPES else "dequantized"
        dtype_name = str(dtype).removeprefix("torch.")
        why = f" ({self.why})" if self.why else ""
        return f"{self.pattern}: {self.count} tensors of {self.kind} {how} to {dtype_name}: +{human_bytes(self.nbytes)}{why}"


def report_float_copies(copies: list[FloatCopy], dtype: torch.dtype, *, warn: bool) -> None:
    """One line per group: a WARNING for linears in float (when `warn`: quantization gguf, where the blocks were
    asked for), INFO for the rest (the embedding's float rows, or everything with quantization none)."""
    for copy in copies:
        logger.log(logging.WARNING if warn and copy.why else logging.INFO, "%s", copy.describe(dtype))


def check_fits(needed: int, what: str) -> None:
    """NotEnoughMemory when `needed` bytes exceed the machine's available memory (when that is known)."""
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise NotEnoughMemory(
            f"not loading: {what} need {human_bytes(needed)}, but the machine has {human_bytes(available)} "
            "available (MemAvailable)"
        )

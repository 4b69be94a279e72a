"""The admin block map at any pool size: a range of the pool as at most `cells` cells of k blocks each.

A pool of 256 blocks is drawn one block a cell; the default CPU pool (5,825 blocks) or a GPU's (hundreds of
thousands) would be a field of sub-pixel cells, and 250,000 per-block states, ref counts and hashes are ~3 MB of
JSON and ~150 ms of serialisation a sample. So the server sums each cell's blocks by state (cached, in use, shared;
free is the rest) and sends those counts as base64 little-endian uint16 arrays: a few KiB whatever the pool, and
under a millisecond of numpy a view. A view at one block a cell also carries each block's ref count, hash prefix
and owners. A page zooms by asking for another range (`start`, `end`); `seq` marks one sequence's blocks.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_CELLS = 16
MAX_CELLS = 8192
DEFAULT_CELLS = 2048
MAX_COUNT = 0xFFFF  # a cell's counts travel as uint16
DEFAULT_PANEL_CELLS = 256  # a replica panel's map: the whole pool in this many cells at most
MAX_REPLICA_NAME = 100
_DECIMAL = re.compile(r"-?[0-9]{1,18}")
REPLICA_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_REPLICA_NAME}}}")  # Serve's replica ids


@dataclass(frozen=True)
class MapView:
    """What a page asks to see: blocks [start, end) (end None: the pool's end) in at most `cells` cells, and the
    sequence whose blocks it marks (None: none). With replicas: the replica whose pool that is (None: the first)
    and the cells of each replica panel's map of its whole pool."""

    start: int = 0
    end: int | None = None
    cells: int = DEFAULT_CELLS
    seq_id: int | None = None
    replica: str | None = None
    panel_cells: int = DEFAULT_PANEL_CELLS

    def bounds(self, num_blocks: int) -> tuple[int, int, int]:
        """(start, end, blocks per cell) inside a pool of `num_blocks`: a range past the pool (a smaller pool after
        a restart) is clipped to it, and an empty one widened to its one block."""
        end = num_blocks if self.end is None else min(self.end, num_blocks)
        start = min(self.start, num_blocks - 1)
        end = max(end, start + 1)
        span = end - start
        # at least ceil(span / 65535) cells, so a cell's count fits its uint16
        cells = max(self.cells, -(-span // MAX_COUNT))
        return start, end, -(-span // cells)


def _int_param(params: Mapping[str, str], name: str, low: int, high: int | None) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    if not _DECIMAL.fullmatch(raw):  # ASCII digits: int() also takes "٣", " 7" and "1_0"
        raise ValueError(f"{name} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    if value < low or (high is not None and value > high):
        limit = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {limit}, got {value}")
    return value


def parse_view(params: Mapping[str, str]) -> MapView:
    """A view from query parameters start, end, cells, seq, replica, pcells (all optional); bad values raise
    ValueError."""
    start = _int_param(params, "start", 0, None) or 0
    end = _int_param(params, "end", 1, None)
    if end is not None and end <= start:
        raise ValueError(f"end must be greater than start, got start {start} and end {end}")
    cells = _int_param(params, "cells", MIN_CELLS, MAX_CELLS) or DEFAULT_CELLS
    replica = params.get("replica") or None
    if replica is not None and not REPLICA_NAME.fullmatch(replica):
        raise ValueError(
            f"replica must be a replica's name (letters, digits, - and _, at most {MAX_REPLICA_NAME}), "
            f"got {replica[:40]!r}"
        )
    panel_cells = _int_param(params, "pcells", MIN_CELLS, MAX_CELLS) or DEFAULT_PANEL_CELLS
    return MapView(start, end, cells, _int_param(params, "seq", 0, None), replica, panel_cells)


@dataclass(frozen=True)
class PoolArrays:
    """One snapshot's per-block arrays, converted once and shared by every page's view."""

    states: np.ndarray  # uint8: 0 free, 1 cached (evictable), 2 in use
    ref_counts: np.ndarray  # int32

    @classmethod
    def from_lists(cls, states: list[int], ref_counts: list[int]) -> PoolArrays:
        """From the engine snapshot's lists."""
        if len(states) != len(ref_counts):
            raise RuntimeError(f"{len(states)} block states but {len(ref_counts)} ref counts")
        return cls(np.array(states, dtype=np.uint8), np.array(ref_counts, dtype=np.int32))

    @property
    def num_blocks(self) -> int:
        return len(self.states)


def _per_cell(mask: np.ndarray, k: int) -> np.ndarray:
    """Sum a boolean mask over consecutive groups of k (the last group may be short)."""
    num_cells = -(-len(mask) // k)
    padded = np.zeros(num_cells * k, dtype=np.uint16)
    padded[: len(mask)] = mask
    return padded.reshape(num_cells, k).sum(axis=1, dtype=np.uint32).astype(np.uint16)


def _encode(counts: np.ndarray) -> str:
    return base64.b64encode(counts.astype("<u2").tobytes()).decode("ascii")


def block_map(
    pool: PoolArrays,
    view: MapView,
    sequences: list[dict[str, Any]],
    hash_prefixes: Mapping[int, str],
    hashed: range | None = None,
) -> dict[str, Any]:
    """The view as JSON: its range, blocks per cell, per-cell counts (base64 uint16: `cached`, `used` (ref 1),
    `shared` (ref > 1), `picked` (blocks of sequence `view.seq_id`, else null)); at one block a cell, `blocks`
    holds each non-free block's ref count, hash prefix and owning sequences. `hashed`: the blocks whose hashes
    the snapshot took (None: all); a block outside it has no `hash` key (a page that just zoomed: the next sample
    has it)."""
    start, end, k = view.bounds(pool.num_blocks)
    states, refs = pool.states[start:end], pool.ref_counts[start:end]
    picked = None
    seq = (
        next((s for s in sequences if s["seq_id"] == view.seq_id), None) if view.seq_id is not None else None
    )
    if seq is not None:
        table = np.array(seq["block_table"], dtype=np.int64)
        mask = np.zeros(end - start, dtype=bool)
        mask[table[(table >= start) & (table < end)] - start] = True
        picked = _encode(_per_cell(mask, k))
    result: dict[str, Any] = {
        "num_blocks": pool.num_blocks,
        "start": start,
        "end": end,
        "blocks_per_cell": k,
        "num_cells": -(-(end - start) // k),
        "seq_id": view.seq_id if seq is not None else None,
        "counts": {
            "cached": _encode(_per_cell(states == 1, k)),
            "used": _encode(_per_cell(refs == 1, k)),
            "shared": _encode(_per_cell(refs > 1, k)),
            "picked": picked,
        },
        "blocks": None,
    }
    if k == 1:
        result["blocks"] = _block_details(start, end, states, refs, sequences, hash_prefixes, hashed)
    return result


def detail_range(views: list[MapView], num_blocks: int) -> range:
    """The blocks whose hashes the views at one block a cell show (the span covering them all; empty if none)."""
    spans = [(s, e) for s, e, k in (v.bounds(num_blocks) for v in views) if k == 1]
    if not spans:
        return range(0)
    return range(min(s for s, _ in spans), max(e for _, e in spans))


def _block_details(
    start: int,
    end: int,
    states: np.ndarray,
    refs: np.ndarray,
    sequences: list[dict[str, Any]],
    hash_prefixes: Mapping[int, str],
    hashed: range | None,
) -> dict[str, dict[str, Any]]:
    owners: dict[int, list[int]] = {}
    for seq in sequences:
        for block_id in seq["block_table"]:
            if start <= block_id < end:
                owners.setdefault(block_id, []).append(seq["seq_id"])
    details: dict[str, dict[str, Any]] = {}
    for offset in np.flatnonzero(states).tolist():  # cached or in use: free blocks have nothing to tell
        block_id = start + offset
        detail: dict[str, Any] = {"refs": int(refs[offset]), "owners": owners.get(block_id, [])}
        if hashed is None or block_id in hashed:
            detail["hash"] = hash_prefixes.get(block_id)  # None: partial, or never full
        details[str(block_id)] = detail
    return details

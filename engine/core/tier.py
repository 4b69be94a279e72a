"""What the scheduler asks of a second KV tier (the disk), and the one job it hands over: load blocks into the pool.

The tier moves bytes on its own threads; the scheduler only calls these methods between steps, never waits on a
load, and keeps the blocks a load writes into referenced (pinned) until the load is done, so no other sequence can
be given them meanwhile. It hands a load over only once no copy of the current step reads a block the load fills.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from engine.core.sequence import Sequence


@dataclass
class LoadJob:
    """Read `block_hashes` (consecutive links of seq's chain) from the tier into pool blocks `block_ids`.

    `pinned_block_ids` are the RAM prefix hits before them, held so they stay cached until admission. The loader
    sets `num_loaded` (leading blocks read and verified), `seconds` and, last, `done`; a finished sequence's job is
    `cancelled` but still completes, since the loader may be writing into its blocks.
    """

    seq: Sequence
    block_hashes: list[bytes]
    block_ids: list[int]
    pinned_block_ids: list[int] = field(default_factory=list)
    cancelled: bool = False
    num_loaded: int = 0
    seconds: float = 0.0
    done: bool = False


@dataclass(frozen=True)
class TierStats:
    """A tier's gauges and counters since start."""

    enabled: bool
    capacity_bytes: int
    used_bytes: int
    num_blocks: int  # blocks this engine's fingerprint may read
    num_files: int  # every block file in the directory, other fingerprints' included
    num_writes: int
    num_write_drops: int  # a full write queue dropped the block
    num_write_errors: int
    write_queue_depth: int
    write_lag_seconds: float  # age of the oldest block queued but not yet on disk
    num_loads: int
    num_loaded_blocks: int
    num_load_failures: int  # blocks gone, torn or corrupt at read time: dropped and recomputed
    load_seconds_total: float
    num_evictions: int
    num_lookups: int  # admissions that looked past their RAM hits
    num_lookups_evicted: int  # ... and stopped at a block the tier had held but evicted


class KVTier(Protocol):
    """A store of full blocks by chain hash, below the RAM pool."""

    def lookup(self, block_hashes: list[bytes]) -> int:
        """How many leading hashes the tier holds (counts the lookup, and whether it stopped at an evicted block)."""
        ...

    def holds(self, block_hash: bytes) -> bool:
        """True if the block is stored or queued for storing."""
        ...

    def offer(self, block_id: int, block_hash: bytes, salt_tag: bytes) -> None:
        """Queue a cached pool block for writing (a staging copy is taken now); a full queue drops it."""
        ...

    def load(self, job: LoadJob) -> None:
        """Start reading a job's blocks on the tier's loader thread."""
        ...

    def take_completed(self) -> list[LoadJob]:
        """Jobs whose loading has finished since the last call."""
        ...

    def wait_for_load(self, timeout: float) -> None:
        """Block until some job completes or `timeout` seconds pass (the step loop has nothing else to run)."""
        ...

    def stats(self) -> TierStats: ...

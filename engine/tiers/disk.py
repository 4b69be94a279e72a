"""The disk tier: full KV blocks as files under one directory, written and read on background threads.

One tier per engine process: the directory (one the tier owns: engine/tiers/tier_dir.py) is locked (flock) while an
engine uses it; a second process pointed at the same directory runs without the tier and says so. Files of every fingerprint share the directory and its byte
cap, evicted least recently used first; only this engine's fingerprint is ever read.

Threads: the engine thread calls `lookup`, `offer` (which copies the block to a staging buffer), `load`,
`take_completed`. The writer thread writes staged blocks and evicts to the cap; the loader thread reads a job's
files into the pool blocks the scheduler reserved for it (nobody else touches those until the job completes).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core.tier import LoadJob, TierStats
from engine.tiers.block_file import (
    BlockName,
    CorruptBlock,
    read_block_file,
    write_block_file,
)
from engine.tiers.tier_dir import LOCK_FILE, is_block_temporary

logger = logging.getLogger(__name__)

EVICTED_MEMORY = 1 << 16  # hashes of evicted blocks remembered, to tell "too small" from "never seen"
NUM_READERS = 4  # block reads in flight per load
_STOP = object()


@dataclass
class _Staged:
    name: BlockName
    values: torch.Tensor  # [num_layers, 2, block_size, Hkv, D], a copy of the block
    scales: torch.Tensor | None
    queued_at: float


class DiskTier:
    """Blocks on disk by (fingerprint, chain hash), LRU within `capacity_bytes`; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        fingerprint: bytes,
        values: torch.Tensor,
        scales: torch.Tensor | None,
        *,
        key: bytes,
        max_queued_blocks: int = 256,
    ) -> None:
        """`directory`: one the tier owns (claim_tier_dir); `values` / `scales`: the pool, [num_layers, 2, num_blocks,
        block_size, Hkv, D] / [..., Hkv] or None; `key`: the secret of the blocks' MACs (load_tier_key).

        Raises OSError when the directory is not writable, or another process holds it.
        """
        self.directory, self.capacity_bytes, self.fingerprint = directory, capacity_bytes, fingerprint
        self._key = key
        self._values, self._scales = values, scales
        self._block_shape = values.shape[:2] + values.shape[3:]
        self.payload_bytes = _nbytes(self._block_shape, values.dtype) + (
            _nbytes(scales.shape[:2] + scales.shape[3:], scales.dtype) if scales is not None else 0
        )
        self._lock_fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise BlockingIOError(f"another process uses the KV disk tier at {directory}") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            os.close(self._lock_fd)
            raise PermissionError(f"{directory} is not writable")
        self.enabled = True
        self._lock = threading.Lock()  # guards the index and counters below
        self._lru: OrderedDict[str, int] = OrderedDict()  # filename -> bytes, least recently used first
        self._held: dict[bytes, BlockName] = {}  # this fingerprint's blocks by hash
        self._evicted: OrderedDict[bytes, None] = OrderedDict()
        self._pending: dict[bytes, float] = {}  # hash -> when it was queued for writing
        self.used_bytes = 0
        self._counters = dict.fromkeys(
            ("writes", "write_drops", "write_errors", "loads", "loaded_blocks", "load_failures", "evictions",
             "lookups", "lookups_evicted"),
            0,
        )  # fmt: skip
        self._load_seconds = 0.0
        started = time.perf_counter()
        self._rebuild_index()
        logger.info(
            "KV disk tier: %s, %d blocks of this model (%d files, %.1f of %.1f MiB) indexed in %.2f s",
            directory, len(self._held), len(self._lru), self.used_bytes / 2**20, capacity_bytes / 2**20,
            time.perf_counter() - started,
        )  # fmt: skip
        self._writes: queue.Queue = queue.Queue(maxsize=max_queued_blocks)
        self._loads: queue.SimpleQueue = queue.SimpleQueue()
        self._completed: list[LoadJob] = []
        self._load_done = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._loader = threading.Thread(target=self._load_loop, name="kv-disk-loader", daemon=True)
        self._readers = ThreadPoolExecutor(max_workers=NUM_READERS, thread_name_prefix="kv-disk-read")
        self._writer.start()
        self._loader.start()

    # ---- the engine thread --------------------------------------------------------------------------------
    def lookup(self, block_hashes: list[bytes]) -> int:
        """How many leading hashes are on disk for this fingerprint."""
        if not self.enabled or not block_hashes:
            return 0
        with self._lock:
            n = 0
            while n < len(block_hashes) and block_hashes[n] in self._held:
                n += 1
            self._counters["lookups"] += 1
            if n < len(block_hashes) and block_hashes[n] in self._evicted:
                self._counters["lookups_evicted"] += 1
        return n

    def holds(self, block_hash: bytes) -> bool:
        with self._lock:
            return block_hash in self._held or block_hash in self._pending

    def offer(self, block_id: int, block_hash: bytes, salt_tag: bytes) -> None:
        """Stage a copy of pool block `block_id` and queue it for writing, unless held, queued, or the queue is full."""
        if not self.enabled or self.holds(block_hash):
            return
        if self._writes.full():
            with self._lock:
                self._counters["write_drops"] += 1
            return
        # a CPU copy whatever the pool's device: the writer turns it into bytes
        values = self._values[:, :, block_id].to("cpu", copy=True)
        scales = self._scales[:, :, block_id].to("cpu", copy=True) if self._scales is not None else None
        now = time.monotonic()
        with self._lock:
            self._pending[block_hash] = now
        self._writes.put_nowait(
            _Staged(BlockName(self.fingerprint, salt_tag, block_hash), values, scales, now)
        )

    def load(self, job: LoadJob) -> None:
        self._loads.put(job)

    def take_completed(self) -> list[LoadJob]:
        with self._lock:
            done, self._completed = self._completed, []
            self._load_done.clear()
        return done

    def wait_for_load(self, timeout: float) -> None:
        self._load_done.wait(timeout)

    def purge(self, salt_tag: bytes) -> int:
        """Delete every block file under a tenant's salt tag (all fingerprints); returns how many went."""
        with self._lock:
            doomed = [
                f for f in self._lru if (n := BlockName.parse(f)) is not None and n.salt_tag == salt_tag
            ]
            for filename in doomed:
                self._forget(filename)
        for filename in doomed:
            _unlink(self.directory / filename)
        return len(doomed)

    def stats(self) -> TierStats:
        with self._lock:
            c = self._counters
            oldest = min(self._pending.values(), default=None)
            return TierStats(
                enabled=self.enabled,
                capacity_bytes=self.capacity_bytes,
                used_bytes=self.used_bytes,
                num_blocks=len(self._held),
                num_files=len(self._lru),
                num_writes=c["writes"],
                num_write_drops=c["write_drops"],
                num_write_errors=c["write_errors"],
                write_queue_depth=len(self._pending),
                write_lag_seconds=0.0 if oldest is None else time.monotonic() - oldest,
                num_loads=c["loads"],
                num_loaded_blocks=c["loaded_blocks"],
                num_load_failures=c["load_failures"],
                load_seconds_total=self._load_seconds,
                num_evictions=c["evictions"],
                num_lookups=c["lookups"],
                num_lookups_evicted=c["lookups_evicted"],
            )

    def close(self, timeout: float = 10.0) -> bool:
        """Write what is queued (up to `timeout` seconds), stop the threads and release the directory; True if the
        queue was drained."""
        if self._lock_fd < 0:
            return True
        deadline = time.monotonic() + timeout
        self._loads.put(_STOP)
        with contextlib.suppress(queue.Full):
            self._writes.put(_STOP, timeout=max(deadline - time.monotonic(), 0.001))
        self._writer.join(max(deadline - time.monotonic(), 0.0))
        self._loader.join(max(deadline - time.monotonic(), 0.0))
        self._readers.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            unwritten = len(self._pending)  # a block leaves it once its file is written
        if unwritten:  # a writer still alive with nothing queued (a close without time to join) lost nothing
            logger.warning("KV disk tier: %d blocks still queued at shutdown were not written", unwritten)
        os.close(self._lock_fd)
        self._lock_fd = -1
        return unwritten == 0

    # ---- the writer thread --------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while (item := self._writes.get()) is not _STOP:
            try:
                if self.enabled:
                    self._write(item)
            except Exception as exc:  # noqa: BLE001 - the writer must not die silently with blocks queued
                self._disable(f"writing a block failed: {type(exc).__name__}: {exc}")
                with self._lock:
                    self._counters["write_errors"] += 1
            finally:
                with self._lock:
                    self._pending.pop(item.name.block_hash, None)

    def _write(self, item: _Staged) -> None:
        payload = _payload(item.values, item.scales)
        try:
            size = write_block_file(str(self.directory), item.name, payload, self._key)
        except OSError as exc:
            self._disable(f"writing {item.name.filename} failed: {exc}")
            with self._lock:
                self._counters["write_errors"] += 1
            return
        doomed: list[str] = []
        with self._lock:
            filename = item.name.filename
            self.used_bytes += size - self._lru.pop(filename, 0)
            self._lru[filename] = size
            self._held[item.name.block_hash] = item.name
            self._evicted.pop(item.name.block_hash, None)
            self._counters["writes"] += 1
            while self.used_bytes > self.capacity_bytes and len(self._lru) > 1:
                victim = next(iter(self._lru))
                self._forget(victim, evicted=True)
                doomed.append(victim)
        for victim in doomed:
            _unlink(self.directory / victim)

    def _disable(self, why: str) -> None:
        if self.enabled:
            self.enabled = False
            logger.warning("KV disk tier turned off (serving goes on without it): %s", why)

    # ---- the loader thread --------------------------------------------------------------------------------
    def _load_loop(self) -> None:
        while (job := self._loads.get()) is not _STOP:
            started = time.perf_counter()
            try:
                if not job.cancelled:
                    job.num_loaded = self._load_blocks(job.block_hashes, job.block_ids)
            except Exception:  # noqa: BLE001 - the job must complete, or its blocks stay held for ever
                logger.exception("KV disk tier: a load failed; its tokens are recomputed")
                job.num_loaded = 0
            job.seconds = time.perf_counter() - started
            with self._lock:
                self._counters["loads"] += 1
                self._counters["loaded_blocks"] += job.num_loaded
                self._load_seconds += job.seconds
                job.done = True
                self._completed.append(job)
                self._load_done.set()

    def _load_blocks(self, block_hashes: list[bytes], block_ids: list[int]) -> int:
        """Read blocks on the reader threads (a disk serves several reads at once faster than one after another);
        returns how many leading blocks were stored. Every read has ended when this returns."""
        futures = [
            self._readers.submit(self._load_block, h, b) for h, b in zip(block_hashes, block_ids, strict=True)
        ]
        num_loaded = 0
        for future in futures:
            try:
                ok = future.result()
            except Exception:  # noqa: BLE001 - a reader's fault ends the load there, never the loader
                logger.exception("KV disk tier: a block read failed; its tokens are recomputed")
                ok = False
            if not ok:
                break
            num_loaded += 1
        for future in futures[num_loaded:]:  # past a failure nothing counts: stop what has not started
            future.cancel()
        # a reader still running writes into a block the scheduler will hand out again: let every one finish
        wait([f for f in futures[num_loaded:] if not f.cancelled()])
        return num_loaded

    def _load_block(self, block_hash: bytes, block_id: int) -> bool:
        with self._lock:
            name = self._held.get(block_hash)
            if name is None:  # evicted since the lookup
                return False
            self._lru.move_to_end(name.filename)
        path = self.directory / name.filename
        try:
            payload = read_block_file(str(path), name, self.payload_bytes, self._key)
            os.utime(path)  # the LRU order survives a restart
        except (OSError, CorruptBlock) as exc:
            logger.warning("KV disk tier: dropping a block (%s); its tokens are recomputed", exc)
            with self._lock:
                self._counters["load_failures"] += 1
                self._forget(name.filename)
            _unlink(path)
            return False
        self._store(block_id, payload)
        return True

    def _store(self, block_id: int, payload: memoryview) -> None:
        raw = torch.frombuffer(payload, dtype=torch.uint8)
        nvalues = _nbytes(self._block_shape, self._values.dtype)
        self._values[:, :, block_id].copy_(raw[:nvalues].view(self._values.dtype).view(self._block_shape))
        if self._scales is not None:
            shape = self._scales.shape[:2] + self._scales.shape[3:]
            self._scales[:, :, block_id].copy_(raw[nvalues:].view(self._scales.dtype).view(shape))

    # ---- the index ----------------------------------------------------------------------------------------
    def _rebuild_index(self) -> None:
        """Index the directory's block files, oldest first by mtime; drop crash leftovers; evict to the cap."""
        found: list[tuple[int, str, int, BlockName]] = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if is_block_temporary(entry.name):  # a write cut short; nobody else writes here (the lock)
                    _unlink(Path(entry.path))
                    continue
                name = BlockName.parse(entry.name)
                if name is None or not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
                found.append((st.st_mtime_ns, entry.name, st.st_size, name))
        found.sort(key=lambda f: (f[0], f[1]))
        for _, filename, size, name in found:
            self._lru[filename] = size
            self.used_bytes += size
            if name.fingerprint == self.fingerprint:
                self._held[name.block_hash] = name
        doomed = []
        while self.used_bytes > self.capacity_bytes and self._lru:
            victim = next(iter(self._lru))
            self._forget(victim, evicted=True)
            doomed.append(victim)
        for victim in doomed:
            _unlink(self.directory / victim)

    def _forget(self, filename: str, *, evicted: bool = False) -> None:
        """Drop a file from the index (caller holds the lock and unlinks it afterwards)."""
        size = self._lru.pop(filename, None)
        if size is None:  # already forgotten (evicted or purged meanwhile)
            return
        self.used_bytes -= size
        name = BlockName.parse(filename)
        if name is not None and name.fingerprint == self.fingerprint:
            self._held.pop(name.block_hash, None)
            if evicted:
                self._evicted[name.block_hash] = None
                if len(self._evicted) > EVICTED_MEMORY:
                    self._evicted.popitem(last=False)
        if evicted:
            self._counters["evictions"] += 1


def _nbytes(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def _payload(values: torch.Tensor, scales: torch.Tensor | None) -> bytes:
    parts = [values.contiguous().view(torch.uint8).numpy().tobytes()]
    if scales is not None:
        parts.append(scales.contiguous().view(torch.uint8).numpy().tobytes())
    return b"".join(parts)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("KV disk tier: cannot delete %s: %s", path, exc)

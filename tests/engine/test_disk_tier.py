"""The disk tier alone, over small pool tensors: files, index, LRU cap, loads, corruption, restarts, the lock."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import torch
import xxhash

from engine.core.hash_chain import NO_SALT, salt_tag
from engine.core.sequence import SamplingParams, Sequence
from engine.core.tier import LoadJob
from engine.tiers import disk as disk_module
from engine.tiers.block_file import (
    HEADER_BYTES,
    BlockName,
    CorruptBlock,
    read_block_file,
    write_block_file,
)
from engine.tiers.disk import DiskTier
from engine.tiers.tier_dir import claim_tier_dir

FP = bytes(range(16))
KEY = bytes(range(32))
OTHER_FP = bytes(range(1, 17))
SHAPE = (2, 2, 6, 4, 2, 8)  # layers, K/V, blocks, block_size, kv heads, head_dim


def make_pool(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        values = torch.randint(-127, 128, SHAPE, generator=gen, dtype=torch.int8)
        scales = torch.rand(SHAPE[:-1], generator=gen).to(torch.float16)
        return values, scales
    return torch.randn(SHAPE, generator=gen).to(dtype), None


def block_hash(i: int) -> bytes:
    return bytes([i]) * 16


def make_tier(directory: Path, pool, capacity: int = 1 << 30, fingerprint: bytes = FP, **kw) -> DiskTier:
    """A tier in `directory` (made here; the tier's own, as claim_tier_dir would hand it over)."""
    values, scales = pool
    directory.mkdir(parents=True, exist_ok=True)
    return DiskTier(directory, capacity, fingerprint, values, scales, **{"key": KEY, **kw})


def write_blocks(tier: DiskTier, block_ids: list[int], tag: bytes = NO_SALT) -> None:
    for block_id in block_ids:
        tier.offer(block_id, block_hash(block_id), tag)
    drain(tier)


def drain(tier: DiskTier) -> None:
    """Wait until the writer has written (or dropped) everything queued."""
    for _ in range(1000):
        if tier.stats().write_queue_depth == 0:
            return
        time.sleep(0.005)
    raise AssertionError("the writer did not drain")


def load(tier: DiskTier, hashes: list[bytes], block_ids: list[int]) -> LoadJob:
    seq = Sequence(0, "r0", [1, 2, 3], 3, SamplingParams(), 0.0)
    job = LoadJob(seq, hashes, block_ids)
    tier.load(job)
    for _ in range(200):
        done = tier.take_completed()
        if done:
            assert done == [job]
            return job
        tier.wait_for_load(0.05)
    raise AssertionError("the load did not complete")


def block_of(pool, block_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    values, scales = pool
    return values[:, :, block_id].clone(), (scales[:, :, block_id].clone() if scales is not None else None)


# ---- the file format ------------------------------------------------------------------------------------------
def test_block_file_round_trip_and_every_kind_of_damage(tmp_path):
    name = BlockName(FP, salt_tag("alice"), block_hash(7))
    payload = os.urandom(1000)
    size = write_block_file(str(tmp_path), name, payload, KEY)
    path = tmp_path / name.filename
    assert size == path.stat().st_size == HEADER_BYTES + 1000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert bytes(read_block_file(str(path), name, 1000, KEY)) == payload
    assert BlockName.parse(name.filename) == name
    assert BlockName.parse("x.kvb") is None and BlockName.parse(name.filename + ".tmp") is None

    with pytest.raises(CorruptBlock, match="another block"):  # the same file asked for by another producer
        read_block_file(str(path), BlockName(OTHER_FP, name.salt_tag, name.block_hash), 1000, KEY)
    with pytest.raises(CorruptBlock, match="bytes, expected"):
        read_block_file(str(path), name, 999, KEY)
    with pytest.raises(CorruptBlock, match="MAC mismatch"):  # another installation's key
        read_block_file(str(path), name, 1000, bytes(32))
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 500] ^= 1  # one flipped bit in the payload
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBlock, match="MAC mismatch"):
        read_block_file(str(path), name, 1000, KEY)
    path.write_bytes(bytes(data[:-10]))  # torn
    with pytest.raises(CorruptBlock, match="bytes, expected"):
        read_block_file(str(path), name, 1000, KEY)


# ---- write, load, evict ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_blocks_written_then_loaded_into_other_blocks_are_bitwise_equal(tmp_path, dtype):
    pool = make_pool(dtype=dtype)
    tier = make_tier(tmp_path, pool)
    expected = [block_of(pool, b) for b in (1, 2)]
    write_blocks(tier, [1, 2])
    assert tier.lookup([block_hash(1), block_hash(2), block_hash(3)]) == 2
    assert tier.lookup([block_hash(2)]) == 1 and tier.lookup([block_hash(3), block_hash(1)]) == 0
    pool[0].zero_()
    job = load(tier, [block_hash(1), block_hash(2)], [4, 5])
    assert job.num_loaded == 2 and job.seconds > 0
    for (values, scales), block_id in zip(expected, (4, 5), strict=True):
        got_values, got_scales = block_of(pool, block_id)
        assert torch.equal(got_values.view(torch.uint8), values.view(torch.uint8))
        if scales is not None:
            assert torch.equal(got_scales, scales)
    stats = tier.stats()
    assert (stats.num_writes, stats.num_loads, stats.num_loaded_blocks, stats.num_blocks) == (2, 1, 2, 2)
    assert tier.close()


def test_a_block_held_or_queued_is_not_written_twice(tmp_path):
    tier = make_tier(tmp_path, make_pool())
    write_blocks(tier, [1])
    tier.offer(3, block_hash(1), NO_SALT)  # same hash, another pool block
    drain(tier)
    assert tier.stats().num_writes == 1 and len(list(tmp_path.glob("*.kvb"))) == 1


def test_lru_eviction_keeps_the_cap_and_remembers_what_it_evicted(tmp_path):
    pool = make_pool()
    probe = make_tier(tmp_path / "probe", pool)
    write_blocks(probe, [0])
    file_bytes = probe.stats().used_bytes
    probe.close()
    tier = make_tier(tmp_path / "tier", pool, capacity=3 * file_bytes)
    write_blocks(tier, [0, 1, 2])
    load(tier, [block_hash(0)], [5])  # block 0 is now the most recently used
    write_blocks(tier, [3])  # evicts block 1, the least recently used
    assert tier.lookup([block_hash(0)]) == 1 and tier.lookup([block_hash(2)]) == 1
    assert tier.lookup([block_hash(1)]) == 0
    stats = tier.stats()
    assert stats.used_bytes == 3 * file_bytes <= stats.capacity_bytes
    assert (stats.num_evictions, stats.num_lookups_evicted) == (1, 1)
    assert sorted(p.name for p in (tmp_path / "tier").glob("*.kvb")) == sorted(
        BlockName(FP, NO_SALT, block_hash(b)).filename for b in (0, 2, 3)
    )


def test_a_full_write_queue_drops_the_block_and_counts_it(tmp_path, monkeypatch):
    pool = make_pool()
    tier = make_tier(tmp_path, pool, max_queued_blocks=1)
    gate = disk_module.threading.Event()
    real_write = disk_module.write_block_file

    def slow_write(*args):
        gate.wait(5)
        return real_write(*args)

    monkeypatch.setattr(disk_module, "write_block_file", slow_write)
    for block_id in range(4):
        tier.offer(block_id, block_hash(block_id), NO_SALT)
    gate.set()
    drain(tier)
    stats = tier.stats()
    assert stats.num_write_drops >= 2 and stats.num_writes + stats.num_write_drops == 4


# ---- what is never served --------------------------------------------------------------------------------------
def test_a_corrupt_file_is_dropped_at_load_and_the_load_stops_there(tmp_path):
    pool = make_pool()
    tier = make_tier(tmp_path, pool)
    write_blocks(tier, [0, 1, 2])
    path = tmp_path / BlockName(FP, NO_SALT, block_hash(1)).filename
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    before = block_of(pool, 5)[0]
    job = load(tier, [block_hash(b) for b in (0, 1, 2)], [4, 5, 3])
    assert job.num_loaded == 1
    assert torch.equal(block_of(pool, 5)[0], before), "a corrupt block must not reach the pool"
    assert not path.exists() and tier.lookup([block_hash(1)]) == 0
    assert tier.stats().num_load_failures == 1


def forge(path: Path, payload: bytes) -> None:
    """What someone with write access to the directory but not the key can do: keep the header, put their own
    payload, and recompute the checksum slot as format 1 did (xxh3-128 of the header fields and the payload)."""
    fields = path.read_bytes()[: HEADER_BYTES - 16]
    path.write_bytes(fields + xxhash.xxh3_128(fields + payload).digest() + payload)


def test_a_block_rewritten_with_a_recomputed_checksum_is_never_served(tmp_path):
    pool = make_pool()
    tier = make_tier(tmp_path, pool)
    write_blocks(tier, [0, 1])
    path = tmp_path / BlockName(FP, NO_SALT, block_hash(1)).filename
    forged = bytes(path.stat().st_size - HEADER_BYTES)  # another tenant's KV made all zeros
    forge(path, forged)
    before = block_of(pool, 5)[0]
    job = load(tier, [block_hash(0), block_hash(1)], [4, 5])
    assert job.num_loaded == 1 and tier.stats().num_load_failures == 1
    assert torch.equal(block_of(pool, 5)[0], before), "a forged block must not reach the pool"
    assert not path.exists() and tier.lookup([block_hash(0), block_hash(1)]) == 1


def test_another_fingerprint_is_never_read_but_shares_the_cap(tmp_path):
    pool = make_pool()
    first = make_tier(tmp_path, pool, fingerprint=OTHER_FP)
    write_blocks(first, [0, 1])
    first.close()
    tier = make_tier(tmp_path, pool)
    assert tier.lookup([block_hash(0)]) == 0
    stats = tier.stats()
    assert (stats.num_blocks, stats.num_files) == (0, 2) and stats.used_bytes > 0


# ---- restarts and the directory --------------------------------------------------------------------------------
def test_restart_rebuilds_the_index_in_lru_order_and_removes_leftover_temporaries(tmp_path):
    pool = make_pool()
    tier = make_tier(tmp_path, pool)
    write_blocks(tier, [0, 1, 2])
    file_bytes = tier.stats().used_bytes // 3
    tier.close()
    for i, block_id in enumerate((1, 2, 0)):  # block 1 oldest
        path = tmp_path / BlockName(FP, NO_SALT, block_hash(block_id)).filename
        os.utime(path, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    leftover = tmp_path / (BlockName(FP, NO_SALT, block_hash(4)).filename + ".123.tmp")
    leftover.write_bytes(b"partial")
    (tmp_path / "notes.tmp").write_bytes(b"not the tier's")
    again = make_tier(tmp_path, make_pool(seed=1), capacity=2 * file_bytes)
    assert not leftover.exists()
    assert (tmp_path / "notes.tmp").exists()  # a name the tier's writer never makes is not its own
    assert again.lookup([block_hash(1)]) == 0  # the oldest went to fit the smaller cap
    assert again.lookup([block_hash(2)]) == 1 and again.lookup([block_hash(0)]) == 1
    expected = block_of(pool, 2)[0]
    load(again, [block_hash(2)], [5])
    assert torch.equal(again._values[:, :, 5], expected)


def test_the_directory_is_private_and_one_process_owns_it(tmp_path):
    directory = claim_tier_dir(tmp_path / "kv")
    assert directory == tmp_path / "kv"  # made by the tier: its own
    tier = make_tier(directory, make_pool())
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    with pytest.raises(BlockingIOError, match="another process"):
        make_tier(directory, make_pool())
    tier.close()
    make_tier(directory, make_pool()).close()  # released at close


def test_a_write_error_turns_the_tier_off_once_and_it_serves_nothing_after(tmp_path, monkeypatch, caplog):
    tier = make_tier(tmp_path, make_pool())
    write_blocks(tier, [0])

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_module, "write_block_file", full)
    tier.offer(1, block_hash(1), NO_SALT)
    tier.offer(2, block_hash(2), NO_SALT)
    drain(tier)
    stats = tier.stats()
    assert not stats.enabled and stats.num_write_errors == 1
    assert tier.lookup([block_hash(0)]) == 0
    assert sum("turned off" in r.message for r in caplog.records) == 1


def test_purge_deletes_one_tenants_blocks_only(tmp_path):
    tier = make_tier(tmp_path, make_pool())
    write_blocks(tier, [0], NO_SALT)
    write_blocks(tier, [1, 2], salt_tag("alice"))
    write_blocks(tier, [3], salt_tag("bob"))
    assert tier.purge(salt_tag("alice")) == 2
    assert [tier.lookup([block_hash(b)]) for b in range(4)] == [1, 0, 0, 1]
    assert len(list(tmp_path.glob("*.kvb"))) == 2


def test_a_close_without_time_to_join_warns_only_when_blocks_are_left_unwritten(tmp_path, caplog):
    """The engine's finalizer closes the tier with no time to join its writer: with every queued block written,
    nothing was lost and nothing is said (it once warned "0 blocks ... were not written" at every exit)."""
    pool = make_pool()
    tier = make_tier(tmp_path / "kv", pool)
    write_blocks(tier, [1, 2])
    with caplog.at_level("WARNING", logger=disk_module.__name__):
        assert tier.close(0.0)
    assert "not written" not in caplog.text

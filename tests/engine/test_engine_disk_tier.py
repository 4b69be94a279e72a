"""The disk tier through the whole engine on a tiny fp32 model: returning conversations after eviction and after a
restart give the same greedy tokens as caching off; corrupt files are recomputed; other settings never read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.core.hash_chain import salt_tag
from engine.tiers.block_file import HEADER_BYTES
from tests.engine.bench_helpers import make_tiny_model_folder

BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 4  # layers x (K, V) x kv_heads x head_dim x block tokens x fp32
POOL_BLOCKS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_folder(tmp_path_factory.mktemp("tiny")))


def make_llm(model_dir: str, tier: Path | None, **overrides) -> LLM:
    disk = {"kv_disk_dir": str(tier)} if tier is not None else {"kv_disk_bytes": 0}
    return LLM(
        model=model_dir,
        dtype="float32",
        kv_cache_bytes=POOL_BLOCKS * BLOCK_BYTES,
        max_model_len=POOL_BLOCKS * 16,
        **{**disk, **overrides},
    )


def conversation(user: int, turn: int) -> list[int]:
    """User `user`'s prompt at `turn`: a 100-token history of its own that grows by 40 tokens a turn."""
    return [(31 * user + 7 * j) % 250 + 3 for j in range(100 + 40 * turn)]


def flood(llm: LLM, seed: int) -> None:
    """An unrelated prompt that takes nearly the whole pool, evicting every cached block."""
    llm.generate([[(seed + 13 * j) % 250 + 3 for j in range((POOL_BLOCKS - 2) * 16)]], GREEDY)


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_returning_conversations_load_from_disk_with_the_same_greedy_tokens(model_dir, tmp_path):
    tiered, reference = (
        make_llm(model_dir, tmp_path / "kv"),
        make_llm(model_dir, None, enable_prefix_caching=False),
    )
    for turn in range(3):
        for user in range(3):
            prompt = conversation(user, turn)
            got = tiered.generate([prompt], GREEDY)[0]
            assert tokens([got]) == tokens(reference.generate([prompt], GREEDY))
            if turn:  # the previous turn's 100 + 40 (turn - 1) tokens came back from disk
                assert got.num_cached_tokens >= (100 + 40 * (turn - 1)) // 16 * 16
            flood(tiered, 1000 * turn + user)
    stats = tiered.engine.stats()
    assert stats.disk_hit_tokens > 0 and stats.tier.num_load_failures == 0
    assert stats.num_used_blocks == 0 and stats.num_loading == 0


def test_a_restart_reuses_the_history_from_disk(model_dir, tmp_path):
    first = make_llm(model_dir, tmp_path / "kv")
    history = conversation(0, 4)  # 260 tokens
    first.generate([history], GREEDY)
    first.engine.close()
    second = make_llm(model_dir, tmp_path / "kv")
    prompt = history + [5, 6, 7]
    got = second.generate([prompt], GREEDY)[0]
    assert got.num_cached_tokens == 256 >= 0.9 * len(history)
    assert second.engine.stats().disk_hit_tokens == 256
    reference = make_llm(model_dir, None, enable_prefix_caching=False)
    assert tokens([got]) == tokens(reference.generate([prompt], GREEDY))


def test_a_corrupt_block_is_recomputed_with_equal_output(model_dir, tmp_path):
    llm = make_llm(model_dir, tmp_path / "kv")
    prompt = conversation(1, 2)  # 180 tokens: 11 full blocks
    expected = tokens(llm.generate([prompt], GREEDY))
    llm.engine.close()
    hashes = llm.engine.scheduler.block_manager.hasher.chain(prompt)
    (victim,) = (tmp_path / "kv").glob(f"*-{hashes[5].hex()}.kvb")
    original = victim.read_bytes()
    raw = bytearray(original)
    raw[len(raw) // 2] ^= 0x01
    victim.write_bytes(bytes(raw))
    again = make_llm(model_dir, tmp_path / "kv")
    got = again.generate([prompt], GREEDY)[0]
    assert tokens([got]) == expected
    assert got.num_cached_tokens == 5 * 16  # blocks 0-4 from disk, the rest recomputed
    assert again.engine.stats().tier.num_load_failures == 1
    again.engine.close()
    # dropped, recomputed, written again: the same KV (under a new nonce and MAC)
    assert victim.read_bytes()[HEADER_BYTES:] == original[HEADER_BYTES:]


def test_other_settings_never_read_the_blocks(model_dir, tmp_path):
    llm = make_llm(model_dir, tmp_path / "kv")
    prompt = conversation(2, 3)
    llm.generate([prompt], GREEDY)
    llm.engine.close()
    other = make_llm(model_dir, tmp_path / "kv", kv_cache_dtype="int8")
    tier = other.engine.stats().tier
    assert tier.num_blocks == 0 < tier.num_files  # indexed, but none of them readable by this engine
    got = other.generate([prompt], GREEDY)[0]
    assert got.num_cached_tokens == 0 and other.engine.stats().disk_hit_tokens == 0


def test_purging_a_tenant_deletes_its_blocks(model_dir, tmp_path):
    llm = make_llm(model_dir, tmp_path / "kv")
    engine = llm.engine
    for salt in (
        "alice",
        "bob",
        "alice\nrequest:drafts",
    ):  # the last: alice's own cache_salt splits hers further
        engine.add_request(salt, conversation(0, 1), GREEDY, cache_salt=salt)
    while engine.has_unfinished_requests():
        engine.step()
    engine.close()
    per_tenant = (140 + 12 - 1) // 16  # full blocks of each tenant's computed tokens
    assert len(list((tmp_path / "kv").glob("*.kvb"))) == 3 * per_tenant
    pool = engine.scheduler.block_manager

    def alices_in_ram() -> int:  # her blocks the small pool still caches (some were evicted for bob's)
        return sum(b.block_hash is not None and b.salt_tag == salt_tag("alice") for b in pool.blocks)

    in_ram = alices_in_ram()
    assert in_ram > 0
    purged = engine.purge_cache_salt("alice")
    assert (purged.disk_blocks, purged.ram_blocks) == (2 * per_tenant, in_ram)
    assert alices_in_ram() == 0
    assert len(list((tmp_path / "kv").glob("*.kvb"))) == per_tenant


def test_a_request_aborted_while_loading_leaves_an_idle_pool(model_dir, tmp_path):
    llm = make_llm(model_dir, tmp_path / "kv")
    prompt = conversation(0, 3)
    llm.generate([prompt], GREEDY)
    flood(llm, 3)
    engine = llm.engine
    engine.add_request("back", prompt + [9], GREEDY)
    engine.step()
    assert engine.stats().num_loading == 1
    engine.abort_request("back")
    steps = 0  # the load still holds its blocks: the engine steps until it is done
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        assert steps < 10_000
    stats = engine.stats()
    assert (stats.num_used_blocks, stats.num_loading) == (0, 0)
    assert stats.num_free_blocks + stats.num_cached_blocks == stats.num_blocks


def test_a_script_that_never_closes_its_engine_writes_the_queue_and_exits_cleanly(model_dir, tmp_path):
    """`LLM.generate`, then the interpreter exits with the engine open: the finalizer gives the writer time to write
    what is queued (it closed with no time at all, left blocks unwritten, and the writer could still be copying
    tensors while Python shut down, which aborted the process about one run in three with the real model)."""
    script = f"""
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.engine.test_engine_disk_tier import conversation, make_llm, GREEDY
llm = make_llm({model_dir!r}, __import__("pathlib").Path({str(tmp_path / "kv")!r}))
llm.generate([conversation(0, 4)], GREEDY)  # 260 prompt tokens + 12: 17 full blocks queued for the tier
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "not written" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-2000:]
    second = make_llm(model_dir, tmp_path / "kv")
    got = second.generate([conversation(0, 4) + [5, 6, 7]], GREEDY)[0]
    assert got.num_cached_tokens == 256  # every full block of the history came back from disk

"""The block-hash chain with a tenant salt entering at the first block past the public prefix."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.hash_chain import BlockHasher, ChainKey, chain_root
from engine.core.sequence import Sequence
from tests.engine.bench_helpers import make_tiny_model_folder

BS = 4
TOKENS = list(range(100, 121))  # 5 full blocks of 4 and one token


def make_seq(seq_id: int, tokens: list[int], salt: str | None, public_prefix_len: int = 0) -> Sequence:
    key = ChainKey(salt, public_prefix_len)
    return Sequence(seq_id, f"r{seq_id}", list(tokens), len(tokens), SamplingParams(), 0.0, chain_key=key)


def run_prompt(bm: BlockManager, seq: Sequence) -> None:
    assert bm.allocate_slots(seq, len(seq) - len(cached := bm.match_prefix(seq)) * BS, cached) == []
    seq.num_computed_tokens = len(seq)
    bm.cache_full_blocks(seq)


@pytest.mark.parametrize("public_prefix_len", [0, 3, 4, 9, 12, 20, 21])
def test_blocks_before_the_salted_one_equal_the_unsalted_chain(public_prefix_len):
    hasher = BlockHasher(BS)
    k = public_prefix_len // BS
    plain = hasher.chain(TOKENS)
    a = hasher.chain(TOKENS, ChainKey("tenant-a", public_prefix_len))
    b = hasher.chain(TOKENS, ChainKey("tenant-b", public_prefix_len))
    assert len(plain) == len(a) == len(b) == 5
    assert a[:k] == b[:k] == plain[:k]
    assert all(x != y and x != p and y != p for x, y, p in zip(a[k:], b[k:], plain[k:], strict=True))
    assert hasher.chain(TOKENS, ChainKey("tenant-a", public_prefix_len)) == a  # deterministic
    assert all(len(h) == 16 for h in a)


def test_salt_from_block_zero_is_the_salted_root():
    hasher = BlockHasher(BS)
    a = hasher.chain(TOKENS, ChainKey("tenant-a"))
    assert a[0] == hasher.hash_block(chain_root("tenant-a"), TOKENS[:BS])
    assert a[1] == hasher.hash_block(a[0], TOKENS[BS : 2 * BS])
    assert hasher.chain(TOKENS, ChainKey(None, 8)) == hasher.chain(TOKENS) == hasher.chain(TOKENS, ChainKey())
    assert hasher.chain(TOKENS, ChainKey("")) != hasher.chain(TOKENS)  # the empty salt is a tenant too


def test_salt_enters_where_the_public_prefix_ends():
    hasher = BlockHasher(BS)
    plain = hasher.chain(TOKENS)
    a = hasher.chain(TOKENS, ChainKey("tenant-a", 9))  # block 2 holds token 9: salted from there
    assert a[2] == hasher.hash_block(plain[1] + chain_root("tenant-a"), TOKENS[8:12])
    assert a[3] == hasher.hash_block(a[2], TOKENS[12:16])
    # one tenant under two public lengths shares only the shorter public prefix
    assert hasher.chain(TOKENS, ChainKey("tenant-a", 4))[:1] == a[:1]
    assert hasher.chain(TOKENS, ChainKey("tenant-a", 4))[1] != a[1]


def test_extend_continues_a_partial_chain():
    hasher, key = BlockHasher(BS), ChainKey("t", 6)
    hashes = hasher.chain(TOKENS[:8], key)
    hasher.extend(hashes, TOKENS, key, 5)
    assert hashes == hasher.chain(TOKENS, key)


def test_public_prefix_len_is_checked():
    with pytest.raises(ValueError, match="public_prefix_len"):
        ChainKey("t", -1)


def test_two_salts_share_exactly_the_public_blocks():
    bm = BlockManager(32, BS)
    owner = make_seq(0, TOKENS, "tenant-a", 9)
    run_prompt(bm, owner)
    assert len(bm.match_prefix(make_seq(1, TOKENS, "tenant-a", 9))) == 5  # its own: every cacheable block
    assert bm.match_prefix(make_seq(2, TOKENS, "tenant-b", 9)) == owner.block_table[:2]  # the public 2
    assert bm.match_prefix(make_seq(3, TOKENS, None)) == owner.block_table[:2]  # isolation off
    assert bm.match_prefix(make_seq(4, TOKENS, "tenant-b", 0)) == []  # no public prefix: nothing shared
    # b computes its own tail on top of the shared public blocks; a's blocks stay a's
    b = make_seq(5, TOKENS, "tenant-b", 9)
    run_prompt(bm, b)
    assert b.block_table[:2] == owner.block_table[:2]
    assert set(b.block_table[2:]).isdisjoint(owner.block_table)
    assert b.num_cached_tokens == 8
    bm.check_invariants([owner, b])


def test_engine_reports_only_public_blocks_cached_across_salts(tmp_path):
    engine = LLMEngine(
        EngineConfig(
            model=str(make_tiny_model_folder(tmp_path / "tiny")),
            dtype="float32",
            block_size=16,
            kv_cache_bytes=2**20,
            max_model_len=256,
        )
    )
    prompt = [(7 * j) % 300 + 3 for j in range(70)]  # 4 full blocks of 16, and 6 tokens

    def cached(request_id: str, salt: str | None, public_prefix_len: int) -> int:
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        engine.add_request(request_id, prompt, params, cache_salt=salt, public_prefix_len=public_prefix_len)
        while engine.has_unfinished_requests():
            outputs = engine.step()
            done = [o for o in outputs if o.finished]
        return done[0].num_cached_tokens

    assert cached("a1", "tenant-a", 40) == 0
    assert cached("a2", "tenant-a", 40) == 64  # every full block of its own prompt
    assert cached("b1", "tenant-b", 40) == 32  # the 2 blocks wholly inside the 40 public tokens
    assert cached("b2", "tenant-b", 40) == 64
    assert cached("c1", "tenant-c", 0) == 0
    with pytest.raises(ValueError, match="public_prefix_len 71"):
        engine.add_request("bad", prompt, SamplingParams(max_tokens=2), cache_salt="t", public_prefix_len=71)

"""What a replica's routing digest costs on a full pool: the engine thread's hash listing, packing, wire size, the
router's decoding and one decision.

    python -m bench.tools.routing_digest_cost [--model smollm2-135m-instruct] [--blocks 250000] [--repeat 20]

The pool size of the default model with the default CPU budget is read from a real engine (loaded, not run); then a
BlockManager of that size (and of each --blocks) is filled with cached blocks, as after a long day of chats, and
each stage is timed (median of --repeat): the engine thread's listing (right after a change, one block evicted and one
stored: a copy; unchanged: the same bytes again), the replica's sort into the digest, the pickled stats, the
router's decoding (a view of the bytes and a sortedness check) and one decision.
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import time
from collections.abc import Callable

from app.cluster.digest import ReplicaDigest
from app.cluster.routing import RouteKey, RoutingBounds, choose
from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.sequence import SamplingParams, Sequence
from engine.core.stats import CacheDigest
from engine.llm_engine import LLMEngine

BS = 16
SEQ_BLOCKS = 64  # each filler sequence: 64 full blocks and one token


def median_ms(fn: Callable[[], object], repeat: int, before: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def fill(num_blocks: int, rng: random.Random) -> tuple[BlockManager, list[Sequence]]:
    """A pool whose every block holds a cached hash (evictable), and the sequences that wrote them."""
    bm = BlockManager(num_blocks, BS)
    seqs = []
    while bm.stats().num_free_blocks > SEQ_BLOCKS:
        seq = make_seq(len(seqs), SEQ_BLOCKS, rng)
        assert bm.allocate_slots(seq, len(seq), []) == []
        seq.num_computed_tokens = len(seq)
        bm.cache_full_blocks(seq)
        bm.free(seq)
        seqs.append(seq)
    return bm, seqs


def make_seq(seq_id: int, num_blocks: int, rng: random.Random) -> Sequence:
    tokens = [rng.randrange(50_000) for _ in range(num_blocks * BS + 1)]
    return Sequence(seq_id, f"r{seq_id}", tokens, len(tokens), SamplingParams(), 0.0)


def measure(num_blocks: int, repeat: int) -> None:
    rng = random.Random(0)
    bm, seqs = fill(num_blocks, rng)
    churn = iter(range(10**9))

    def change() -> None:  # one block evicted, one stored: the listing must be rebuilt
        seq = make_seq(-1 - next(churn), 1, rng)
        assert bm.allocate_slots(seq, len(seq), []) == []
        seq.num_computed_tokens = len(seq)
        bm.cache_full_blocks(seq)
        bm.free(seq)

    listing = median_ms(bm.cached_hash_prefixes, repeat, before=change)  # the engine thread's part
    memo = median_ms(bm.cached_hash_prefixes, repeat)
    cache = CacheDigest(bm.cached_hash_prefixes(), 8, 0, bm.stats().num_free_blocks, num_blocks, 256, BS)
    pack = median_ms(
        lambda: ReplicaDigest.from_engine("r1", cache, time.time()), repeat
    )  # the replica's part
    digest = ReplicaDigest.from_engine("r1", cache, time.time())
    stats = digest.to_stats()
    wire = len(pickle.dumps(stats))
    decode = median_ms(lambda: ReplicaDigest.from_stats(stats), repeat)  # the router's, once per stats update
    other = ReplicaDigest.from_stats(ReplicaDigest.from_engine("r2", cache, time.time()).to_stats())
    route = RouteKey.from_chain(seqs[len(seqs) // 2].block_hashes[:SEQ_BLOCKS])
    received = ReplicaDigest.from_stats(stats)
    bounds = RoutingBounds()
    decide = median_ms(
        lambda: choose(route, [received, other], "kv", received.taken_at, None, bounds), repeat
    )
    print(
        f"{num_blocks:>8} blocks ({digest.num_cached_blocks} cached): engine listing {listing:.3f} ms after a change, "
        f"{memo * 1e3:.1f} us unchanged | replica sort+pack {pack:.2f} ms | stats {wire / 1e3:.1f} kB pickled | "
        f"router decode {decode:.3f} ms | choose (64-block route, 2 replicas) {decide * 1e3:.0f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--blocks", type=int, nargs="*", default=[250_000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, device="cpu"))
    print(
        f"default pool of {args.model} on CPU: {engine.num_blocks} blocks of {engine.config.block_size} tokens"
    )
    engine.close()
    for num_blocks in [engine.num_blocks, *args.blocks]:
        measure(num_blocks, args.repeat)


if __name__ == "__main__":
    main()

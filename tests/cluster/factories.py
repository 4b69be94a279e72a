"""Factories for router tests: chains hashed like the engine's, digests of replicas holding given blocks."""

from __future__ import annotations

from app.cluster.digest import ReplicaDigest
from app.cluster.routing import RouteKey, route_key
from engine.core.hash_chain import BlockHasher, ChainKey

BS = 4
NOW = 1_000_000.0  # time.time() of the tests' decisions
HASHER = BlockHasher(BS, b"pool")


def make_tokens(num_blocks: int, seed: int = 0) -> list[int]:
    """num_blocks full blocks and one token more (the engine may take every full block from its cache)."""
    return [10 + (i * 7919 + seed * 104729) % 5000 for i in range(num_blocks * BS + 1)]


def make_route(
    num_blocks: int, seed: int = 0, salt: str | None = None, session: str | None = None, public: int = 0
) -> RouteKey:
    return route_key(HASHER, make_tokens(num_blocks, seed), ChainKey(salt, public), session)


def make_digest(
    name: str,
    held: tuple[bytes, ...] = (),
    *,
    running: int = 0,
    waiting: int = 0,
    free_blocks: int = 1000,
    max_num_seqs: int = 8,
    age_s: float = 0.1,
) -> ReplicaDigest:
    """A replica holding the hash prefixes `held`, reported `age_s` before NOW."""
    return ReplicaDigest.from_prefixes(
        name,
        b"".join(held),
        num_running=running,
        num_waiting=waiting,
        num_free_blocks=free_blocks,
        num_blocks=2000,
        max_num_seqs=max_num_seqs,
        taken_at=NOW - age_s,
    )

"""KV-aware routing over engine replicas: a request's block-hash chain against the blocks each replica holds.

The ingress hashes a request's prompt with the engines' own chain (`engine.core.hash_chain`: block size, pool salt,
tenant salt and public prefix), so a replica holds the request's first k blocks exactly when the first k hashes of
its `RouteKey` are among the replica's cached hashes. Replicas report those hashes, with their load, as a
`ReplicaDigest` (`app.cluster.digest`; Ray Serve pulls it every stats period); `choose` scores the candidates:

- a digest older than `RoutingBounds.stale_after_s` earns no prefix credit, nor shows load; what the router itself
  sent to a replica within that time is credited to it (`RouterMemory`), digest or not;
- score = leading blocks held − `blocks_per_request` × load (running + waiting, or the router's own count of
  requests in flight there, whichever is larger): one more request in a replica's batch is worth 8 blocks (128
  tokens at block size 16) of prefill, so a long cached history outweighs a slightly longer queue while a prefix
  that only one replica happens to hold yet (a popular system prompt) does not draw every request to it;
- a replica is overloaded when it has a queue (waiting, or more requests than it runs at once) and its load exceeds
  the least loaded one's by more than `max_load_gap`, or when its free blocks cannot take the request's uncached
  part: overloaded replicas are passed over while any other is left;
- a request of a known session goes back to the session's replica unless that one is overloaded or gone;
- equal scores break on lower load, more free blocks, then the name: the same inputs, the same replica.

Chains and digests carry 8-byte hash prefixes (`DIGEST_HASH_BYTES`): 8 bytes a cached block in the digest, and a
false match needs two different 64-bit prefixes to collide (about 1e-14 per lookup against a 250,000-block pool).
No Ray import here: plain Python, tested without a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from app.cluster.digest import DIGEST_HASH_BYTES, PREFIX_DTYPE, ReplicaDigest
from engine.core.hash_chain import (
    BlockHasher,
    ChainKey,
    num_cacheable_blocks,
    pool_hash_salt,
)

if TYPE_CHECKING:
    from app.cluster.routing_memory import RouterMemory
    from engine.core.config import EngineConfig

POLICIES = ("kv", "round-robin", "least-loaded")
# longest_prefix: went to a replica holding the longest cached prefix (> 0 blocks); load_fallback: a replica held
# more but was overloaded, or busier by more than the blocks were worth; no_prefix: nobody held a block (by load);
# session: kept on the session's replica, whose digest was stale or showed fewer blocks than another's
OUTCOMES = ("longest_prefix", "load_fallback", "no_prefix", "session", "round_robin", "least_loaded")


def check_policy(policy: str) -> str:
    """The policy, or ValueError naming the choices."""
    if policy not in POLICIES:
        raise ValueError(f"routing policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


@dataclass(frozen=True)
class RouteKey:
    """What the router knows of a request: its leading full blocks' hash prefixes and its chat session (or None)."""

    # DIGEST_HASH_BYTES-byte prefixes of the prompt's cacheable blocks' hashes, in order
    chain: tuple[bytes, ...]
    session: str | None = None

    def __post_init__(self) -> None:
        bad = next((h for h in self.chain if not isinstance(h, bytes) or len(h) != DIGEST_HASH_BYTES), None)
        if bad is not None:
            raise ValueError(f"a route's chain holds {DIGEST_HASH_BYTES}-byte hash prefixes, got {bad!r}")

    @classmethod
    def from_chain(cls, chain: Sequence[bytes], session: str | None = None) -> RouteKey:
        """A route from full block hashes (BlockHasher's), cut to their prefixes."""
        return cls(tuple(h[:DIGEST_HASH_BYTES] for h in chain), session)


def pool_hasher(config: EngineConfig) -> BlockHasher:
    """The block hasher of an engine built from `config`: its block size and pool salt, as its scheduler's."""
    return BlockHasher(config.block_size, pool_hash_salt(config.prefix_cache_salt))


def route_key(
    hasher: BlockHasher, token_ids: list[int], chain_key: ChainKey, session: str | None = None
) -> RouteKey:
    """The route of a prompt: the chain of the full blocks an engine may take from its cache (all but the last
    token's), under the request's tenant salt and public prefix."""
    hashes: list[bytes] = []
    hasher.extend(hashes, token_ids, chain_key, num_cacheable_blocks(len(token_ids), hasher.block_size))
    return RouteKey.from_chain(hashes, session)


@dataclass(frozen=True)
class RoutingBounds:
    """The router's tunables; `for_period` derives the staleness bound from the stats period."""

    stale_after_s: float = 1.25  # a digest older than this earns no prefix credit
    max_load_gap: int = 4  # requests beyond the least loaded replica's that a replica with a queue may carry
    # prefix blocks one more request in a replica's load is worth: on a CPU an extra sequence slows every step of
    # that replica's batch for the whole reply, which costs about as much as recomputing a few hundred tokens; a
    # benchmark with a weight of 1 piled 67 of 92 requests on the replica that held the warmed system prompt
    blocks_per_request: float = 8.0
    # sessions whose replica is remembered (the least recently routed forgotten first)
    session_capacity: int = 10_000

    @classmethod
    def for_period(cls, period_s: float, **overrides: Any) -> RoutingBounds:
        """Bounds for replicas that refresh their digest and are pulled every `period_s`: stale past 3 periods
        (the replica's refresh, Serve's pull, slack) plus 0.5 s (Serve's 0.1 s control loop, an engine step)."""
        if not period_s > 0:
            raise ValueError(f"the routing stats period must be positive, got {period_s!r}")
        return cls(**{"stale_after_s": 3 * period_s + 0.5, **overrides})


@dataclass(frozen=True)
class Decision:
    """Where one request goes, why, and how many of its leading blocks the chosen replica (and the best) held."""

    replica: str
    matched_blocks: int
    best_matched_blocks: int
    outcome: str  # one of OUTCOMES
    ranking: tuple[str, ...]  # every candidate: the chosen one first, then the rest by load
    matched_by_replica: Mapping[str, int] = field(default_factory=dict, compare=False)

    def redirected(self, replica: str) -> Decision:
        """The decision as it turned out when Ray Serve sent the request to `replica` instead (the chosen one was
        at its max_ongoing_requests): a load fallback when that replica held less than the best."""
        if replica == self.replica:
            return self
        matched = self.matched_by_replica.get(replica, 0)
        outcome = self.outcome
        if self.outcome not in ("round_robin", "least_loaded"):
            outcome = "load_fallback" if matched < self.best_matched_blocks else _prefix_outcome(matched)
        return Decision(
            replica, matched, self.best_matched_blocks, outcome, self.ranking, self.matched_by_replica
        )


def _prefix_outcome(matched: int) -> str:
    return "longest_prefix" if matched > 0 else "no_prefix"


@dataclass(frozen=True)
class _Candidate:
    name: str
    matched: int
    load: int
    queue: int
    free_blocks: float
    fresh: bool


def _candidates(
    route: RouteKey | None,
    digests: Sequence[ReplicaDigest],
    now: float,
    memory: RouterMemory | None,
    bounds: RoutingBounds,
) -> list[_Candidate]:
    out = []
    chain = route.chain if route is not None else ()
    chain_values = np.frombuffer(b"".join(chain), dtype=PREFIX_DTYPE)
    for d in digests:
        fresh = now - d.taken_at <= bounds.stale_after_s
        in_flight = memory.in_flight(d.name) if memory is not None else 0
        load = max(d.num_running + d.num_waiting if fresh else 0, in_flight)
        held = d.holds(chain_values).tolist() if fresh else [False] * len(chain)
        recent = memory.recent_hashes(d.name, now) if memory is not None else {}
        matched = 0
        while matched < len(chain) and (held[matched] or chain[matched] in recent):
            matched += 1
        queue = max(d.num_waiting if fresh else 0, load - d.max_num_seqs)
        out.append(_Candidate(d.name, matched, load, queue, d.num_free_blocks if fresh else math.inf, fresh))
    return out


def choose(
    route: RouteKey | None,
    digests: Sequence[ReplicaDigest],
    policy: str,
    now: float,
    memory: RouterMemory | None = None,
    bounds: RoutingBounds = RoutingBounds(),  # noqa: B008 - frozen, never changed
) -> Decision:
    """Pick the replica for one request among `digests` (the live candidates) under `policy`; see the module's
    docstring. Changes nothing: the caller tells `memory` where the request went (`RouterMemory.record`).
    A request without a route (an admin call) goes to the least loaded replica."""
    check_policy(policy)
    if not digests:
        raise RuntimeError("choose() needs at least one replica")
    names = [d.name for d in digests]
    if len(set(names)) != len(names):
        raise RuntimeError(f"replica names repeat: {sorted(names)}")
    cands = _candidates(route, digests, now, memory, bounds)
    by_load = sorted(cands, key=lambda c: (c.load, -c.free_blocks, c.name))
    best = max(c.matched for c in cands)
    if route is None or policy == "least-loaded":
        chosen, outcome = by_load[0], "least_loaded"
    elif policy == "round-robin":
        turn = memory.round_robin_turn if memory is not None else 0
        chosen, outcome = sorted(cands, key=lambda c: c.name)[turn % len(cands)], "round_robin"
    else:
        chosen, outcome = _choose_kv(route, cands, best, memory, bounds)
    ranking = (chosen.name, *(c.name for c in by_load if c is not chosen))
    matched = {c.name: c.matched for c in cands}
    return Decision(chosen.name, chosen.matched, best, outcome, ranking, matched)


def _choose_kv(
    route: RouteKey,
    cands: list[_Candidate],
    best: int,
    memory: RouterMemory | None,
    bounds: RoutingBounds,
) -> tuple[_Candidate, str]:
    min_load = min(c.load for c in cands)

    def overloaded(c: _Candidate) -> bool:
        long_queue = c.queue > 0 and c.load - min_load > bounds.max_load_gap
        return long_queue or c.free_blocks < len(route.chain) - c.matched + 1

    pool = [c for c in cands if not overloaded(c)] or cands
    sticky = memory.session_replica(route.session) if memory is not None and route.session else None
    for c in pool:
        if c.name == sticky:  # kept there even where another replica shows more blocks: "session"
            return c, _prefix_outcome(c.matched) if c.matched == best else "session"
    w = bounds.blocks_per_request
    chosen = min(pool, key=lambda c: (w * c.load - c.matched, c.load, -c.free_blocks, c.name))
    if best == 0:
        return chosen, "no_prefix"
    return chosen, "longest_prefix" if chosen.matched == best else "load_fallback"

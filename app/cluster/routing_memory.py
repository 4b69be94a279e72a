"""What a KV-aware router remembers between decisions, beyond the replicas' digests.

- sessions: each chat session's last replica (a bounded LRU), so a session's next turn goes back there;
- in flight: requests routed to each replica and not completed yet, a load figure fresher than any digest;
- recent routes: the chain hashes of requests just routed to a replica, credited to it until a digest could show
  them (`RoutingBounds.stale_after_s`): a burst of requests sharing a prefix gathers on one replica instead of
  spreading before the first one's blocks appear in a digest;
- the round-robin turn.

Not thread-safe: one router (on Serve's routing event loop) owns it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping

from app.cluster.routing import RouteKey, RoutingBounds


class RouterMemory:
    """Sessions' replicas, requests in flight, recently routed chains and the round-robin turn."""

    def __init__(self, bounds: RoutingBounds) -> None:
        if bounds.session_capacity < 1:
            raise ValueError(f"session_capacity must be at least 1, got {bounds.session_capacity}")
        self.bounds = bounds
        self.round_robin_turn = 0
        self._session_to_replica: OrderedDict[str, str] = OrderedDict()
        self._in_flight: Counter[str] = Counter()
        # replica -> chain hash prefix -> until when it is credited (oldest expiry first: entries are refreshed
        # by moving them to the end, and all share one lifetime)
        self._recent: dict[str, OrderedDict[bytes, float]] = {}

    def session_replica(self, session: str) -> str | None:
        """The replica the session's last request went to, or None."""
        return self._session_to_replica.get(session)

    def in_flight(self, replica: str) -> int:
        return self._in_flight[replica]

    def recent_hashes(self, replica: str, now: float) -> Mapping[bytes, float]:
        """The chain hashes credited to the replica at `now` (expired ones dropped)."""
        recent = self._recent.get(replica)
        if recent is None:
            return {}
        while recent and next(iter(recent.values())) < now:
            recent.popitem(last=False)
        return recent

    def record(self, replica: str, route: RouteKey, now: float) -> None:
        """A request went to `replica` (Serve accepted it there): its session and chain now point there."""
        self.round_robin_turn += 1
        if route.session is not None:
            self._session_to_replica[route.session] = replica
            self._session_to_replica.move_to_end(route.session)
            while len(self._session_to_replica) > self.bounds.session_capacity:
                self._session_to_replica.popitem(last=False)
        self.credit(replica, route.chain, now)

    def credit(self, replica: str, chain: tuple[bytes, ...], now: float) -> None:
        """Credit `chain` to the replica for one staleness period from `now`: at routing, and again when the
        request completes (its blocks are cached there from then on, and only digests taken after that show
        them, so a request that ran longer than the period keeps its credit). Serve does not say how a request
        ended: one that failed before its prefill is credited too, for that one period."""
        recent = self._recent.setdefault(replica, OrderedDict())
        until = now + self.bounds.stale_after_s
        for block_hash in chain:
            recent[block_hash] = until
            recent.move_to_end(block_hash)
        # drop what expired, so the map stays as small as one lifetime's routes
        self.recent_hashes(replica, now)

    def start(self, replica: str) -> None:
        """A request is in flight on `replica`."""
        self._in_flight[replica] += 1

    def finish(self, replica: str) -> None:
        """A request routed to `replica` completed (or failed)."""
        if self._in_flight[replica] <= 0:
            raise RuntimeError(f"replica {replica!r}: a request finished that was never recorded in flight")
        self._in_flight[replica] -= 1
        if not self._in_flight[replica]:
            del self._in_flight[replica]

    def forget_replica(self, replica: str) -> None:
        """The replica is gone: nothing is credited to it; its sessions move on their next request."""
        self._in_flight.pop(replica, None)
        self._recent.pop(replica, None)

"""The routing decisions the ingress made, counted per replica and outcome, for /metrics, /admin and the bench."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from app.cluster.routing import OUTCOMES, Decision


@dataclass(frozen=True)
class ReplicaRouting:
    """One replica's share of the routed requests."""

    requests: dict[str, int]  # outcome -> requests routed there with it (every outcome present, 0 included)
    num_at_longest: (
        int  # of those, routed where the longest cached prefix was (matched == best, 0 == 0 included)
    )
    matched_blocks: int  # leading blocks the replica held, summed over its requests
    best_matched_blocks: int  # the most any candidate held, summed over the same requests
    route_blocks: int  # the requests' full blocks, summed

    @property
    def num_requests(self) -> int:
        return sum(self.requests.values())


class RoutingLedger:
    """Counts decisions per (replica, outcome) and the blocks they matched. Thread-safe: Serve's router writes it
    on its own event loop thread, the app reads it on the server's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, str]] = Counter()
        self._at_longest: Counter[str] = Counter()
        self._matched: Counter[str] = Counter()
        self._best: Counter[str] = Counter()
        self._route_blocks: Counter[str] = Counter()

    def record(self, decision: Decision, num_route_blocks: int) -> None:
        """One request went to decision.replica (as Serve finally sent it)."""
        if decision.outcome not in OUTCOMES:
            raise RuntimeError(f"unknown routing outcome {decision.outcome!r}")
        name = decision.replica
        with self._lock:
            self._requests[name, decision.outcome] += 1
            self._at_longest[name] += decision.matched_blocks == decision.best_matched_blocks
            self._matched[name] += decision.matched_blocks
            self._best[name] += decision.best_matched_blocks
            self._route_blocks[name] += num_route_blocks

    def snapshot(self) -> dict[str, ReplicaRouting]:
        """Every replica that got a request so far (dead ones kept: the counts are totals), by name."""
        with self._lock:
            names = sorted({name for name, _ in self._requests})
            return {
                name: ReplicaRouting(
                    requests={outcome: self._requests[name, outcome] for outcome in OUTCOMES},
                    num_at_longest=self._at_longest[name],
                    matched_blocks=self._matched[name],
                    best_matched_blocks=self._best[name],
                    route_blocks=self._route_blocks[name],
                )
                for name in names
            }

    def forget(self, names: set[str]) -> None:
        """Drop the counts of these replicas: their replica set was deleted (a model unloaded), and a model that
        loads and unloads all day would otherwise add a few counters per replica each time, for the process's life."""
        with self._lock:
            for key in [key for key in self._requests if key[0] in names]:
                del self._requests[key]
            for counter in (self._at_longest, self._matched, self._best, self._route_blocks):
                for name in names:
                    counter.pop(name, None)

    def clear(self) -> None:
        """Forget every count (a fresh replica set, a test)."""
        with self._lock:
            for counter in (self._requests, self._at_longest, self._matched, self._best, self._route_blocks):
                counter.clear()


# The ingress's one ledger. Module state, against the house habit, because Ray Serve builds the request router
# itself (from a class path, with JSON kwargs) inside the deployment handle: this is the one object that both it and
# the app can reach in the ingress process.
LEDGER = RoutingLedger()

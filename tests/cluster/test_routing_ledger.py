"""RouterMemory's in-flight counts and chain credit; RoutingLedger's counts per replica and outcome."""

from __future__ import annotations

import threading

import pytest

from app.cluster.routing import OUTCOMES, Decision, RoutingBounds
from app.cluster.routing_ledger import RoutingLedger
from app.cluster.routing_memory import RouterMemory
from tests.cluster.factories import NOW, make_route


def test_in_flight_counts_start_and_finish():
    memory = RouterMemory(RoutingBounds())
    memory.start("a")
    memory.start("a")
    memory.finish("a")
    assert (memory.in_flight("a"), memory.in_flight("b")) == (1, 0)
    memory.forget_replica("a")
    assert memory.in_flight("a") == 0
    with pytest.raises(RuntimeError, match="never recorded"):
        memory.finish("a")


def test_chain_credit_expires_and_is_refreshed():
    memory = RouterMemory(RoutingBounds(stale_after_s=1.0))
    first, second = make_route(3), make_route(2, seed=1)
    memory.record("a", first, NOW)
    memory.record("a", second, NOW + 0.5)
    assert set(memory.recent_hashes("a", NOW + 0.9)) == set(first.chain) | set(second.chain)
    assert set(memory.recent_hashes("a", NOW + 1.2)) == set(second.chain)  # first's expired and dropped
    memory.record("a", first, NOW + 1.3)  # routed again: credited again
    assert set(memory.recent_hashes("a", NOW + 1.6)) == set(first.chain)
    assert memory.recent_hashes("b", NOW) == {}
    memory.forget_replica("a")
    assert memory.recent_hashes("a", NOW + 1.6) == {}


def decision(replica: str, outcome: str, matched: int, best: int) -> Decision:
    return Decision(replica, matched, best, outcome, (replica,))


def test_ledger_counts_per_replica_and_outcome():
    ledger = RoutingLedger()
    ledger.record(decision("a", "longest_prefix", 5, 5), 6)
    ledger.record(decision("a", "no_prefix", 0, 0), 3)
    ledger.record(decision("b", "load_fallback", 1, 5), 6)
    ledger.record(decision("b", "round_robin", 2, 2), 2)
    snap = ledger.snapshot()
    assert list(snap) == ["a", "b"]
    a, b = snap["a"], snap["b"]
    assert set(a.requests) == set(OUTCOMES)
    assert (a.requests["longest_prefix"], a.requests["no_prefix"], a.num_requests) == (1, 1, 2)
    assert (a.num_at_longest, a.matched_blocks, a.best_matched_blocks, a.route_blocks) == (2, 5, 5, 9)
    assert (b.requests["load_fallback"], b.requests["round_robin"], b.num_at_longest) == (1, 1, 1)
    assert (b.matched_blocks, b.best_matched_blocks) == (3, 7)
    ledger.forget({"b", "gone"})  # b's replica set was deleted
    assert list(ledger.snapshot()) == ["a"] and ledger.snapshot()["a"] == a
    ledger.clear()
    assert ledger.snapshot() == {}
    with pytest.raises(RuntimeError, match="unknown routing outcome"):
        ledger.record(decision("a", "lucky", 0, 0), 0)


def test_ledger_takes_writes_from_several_threads():
    ledger = RoutingLedger()

    def write() -> None:
        for _ in range(2000):
            ledger.record(decision("a", "longest_prefix", 1, 1), 1)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = ledger.snapshot()["a"]
    assert (a.num_requests, a.matched_blocks, a.route_blocks) == (8000, 8000, 8000)

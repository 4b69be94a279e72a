"""choose(): prefix credit, load, overload fallback, staleness, stickiness, tie-breaks, salts; the digest's wire form."""

from __future__ import annotations

import pytest

from app.cluster.digest import DIGEST_HASH_BYTES, STATS_KEY, ReplicaDigest
from app.cluster.routing import (
    Decision,
    RouteKey,
    RoutingBounds,
    choose,
    route_key,
)
from app.cluster.routing_memory import RouterMemory
from engine.core.hash_chain import ChainKey
from engine.core.stats import CacheDigest
from tests.cluster.factories import HASHER, NOW, make_digest, make_route, make_tokens

BOUNDS = RoutingBounds.for_period(0.25)  # stale after 1.25 s


def kv(route, digests, memory=None):
    return choose(route, digests, "kv", NOW, memory, BOUNDS)


def test_route_keys_hold_hash_prefixes():
    route = make_route(3, session="s1")
    assert len(route.chain) == 3 and all(len(h) == DIGEST_HASH_BYTES for h in route.chain)
    assert route.chain == tuple(h[:8] for h in HASHER.chain(make_tokens(3)))
    assert make_route(0).chain == ()  # 1 token: no full block the engine would take from its cache
    with pytest.raises(ValueError, match="8-byte hash prefixes"):
        RouteKey((b"\x00" * 16,))


def test_the_replica_holding_the_longest_prefix_wins():
    route = make_route(6)
    digests = [make_digest("a", route.chain[:2]), make_digest("b", route.chain[:5]), make_digest("c")]
    d = kv(route, digests)
    assert (d.replica, d.matched_blocks, d.best_matched_blocks, d.outcome) == ("b", 5, 5, "longest_prefix")
    assert d.ranking == ("b", "a", "c")  # then by load (equal), free blocks (equal), name


def test_only_leading_blocks_count():
    route = make_route(4)
    d = kv(route, [make_digest("a", route.chain[1:]), make_digest("b", route.chain[:1])])
    assert (d.replica, d.matched_blocks) == ("b", 1)  # a holds 3 blocks, but not the first


def test_one_request_of_load_is_worth_eight_cached_blocks():
    route = make_route(24)
    # a holds 20 blocks more; b is 2 requests lighter: a still scores better (20 - 8 x 2 > 0)
    digests = [make_digest("a", route.chain[:20], running=3), make_digest("b", running=1)]
    assert kv(route, digests).replica == "a"
    # 3 requests lighter outweighs 20 blocks: a load fallback
    digests = [make_digest("a", route.chain[:20], running=4), make_digest("b", running=1)]
    d = kv(route, digests)
    assert (d.replica, d.matched_blocks, d.best_matched_blocks, d.outcome) == ("b", 0, 20, "load_fallback")


def test_a_prefix_only_one_replica_holds_yet_does_not_draw_every_request():
    """A published system prompt computed once (on a): new conversations go to a until it is 4 requests busier,
    then to b, which computes the prompt too, and from then on they balance."""
    system_prompt = make_tokens(25)[:-1]
    memory = RouterMemory(BOUNDS)
    digests = [make_digest("a", make_route(25).chain), make_digest("b")]
    placed = []
    for i in range(8):
        route = route_key(HASHER, system_prompt + make_tokens(3, seed=i + 1), ChainKey(None, 0))
        assert route.chain[:25] == make_route(25).chain
        placed.append(kv(route, digests, memory).replica)
        memory.record(placed[-1], route, NOW)
        memory.start(placed[-1])
    assert placed == ["a", "a", "a", "a", "b", "b", "b", "b"]


def test_a_replica_with_a_long_queue_is_overloaded_however_much_it_holds():
    route = make_route(40)
    busy = make_digest("a", route.chain, running=8, waiting=5)  # queue of 5, load 13 vs 0: past the gap of 4
    d = kv(route, [busy, make_digest("b")])
    assert (d.replica, d.outcome, d.best_matched_blocks) == ("b", "load_fallback", 40)
    # within the gap it keeps the request: a queue of 1, load 9 vs 5
    d = kv(route, [make_digest("a", route.chain, running=8, waiting=1), make_digest("b", running=5)])
    assert (d.replica, d.outcome) == ("a", "longest_prefix")


def test_requests_past_max_num_seqs_count_as_a_queue():
    route = make_route(40)
    memory = RouterMemory(BOUNDS)
    for _ in range(9):  # routed there since its digest (which shows none): 1 more than it runs at once
        memory.start("a")
    d = kv(route, [make_digest("a", route.chain, max_num_seqs=4), make_digest("b")], memory)
    assert (d.replica, d.outcome) == ("b", "load_fallback")


def test_too_few_free_blocks_for_the_uncached_part_is_overload():
    route = make_route(10)
    tight = make_digest("a", route.chain[:6], free_blocks=4)  # needs 10 - 6 + 1 = 5
    assert kv(route, [tight, make_digest("b", running=3)]).replica == "b"
    roomy = make_digest("a", route.chain[:6], free_blocks=5)
    assert kv(route, [roomy, make_digest("b", running=3)]).replica == "a"


def test_when_every_replica_is_overloaded_the_scores_still_decide():
    route = make_route(10)
    d = kv(route, [make_digest("a", route.chain, free_blocks=0), make_digest("b", free_blocks=0)])
    assert (d.replica, d.outcome) == ("a", "longest_prefix")


def test_stale_digests_earn_no_prefix_credit_and_show_no_load():
    route = make_route(5)
    stale = make_digest("a", route.chain, running=50, age_s=1.3)  # the bound is 3 x 0.25 + 0.5 = 1.25 s
    d = kv(route, [stale, make_digest("b", running=1)])
    assert (d.replica, d.matched_blocks, d.best_matched_blocks, d.outcome) == ("a", 0, 0, "no_prefix")
    fresh = make_digest("a", route.chain, age_s=1.2)
    assert kv(route, [fresh, make_digest("b")]).matched_blocks == 5
    assert kv(route, [ReplicaDigest.unknown("a"), make_digest("b", running=1)]).replica == "a"


def test_recently_routed_chains_are_credited_until_a_digest_could_show_them():
    route = make_route(5)
    memory = RouterMemory(BOUNDS)
    memory.record("b", route, NOW - 1.0)
    d = kv(route, [make_digest("a", route.chain[:2]), make_digest("b")], memory)
    assert (d.replica, d.matched_blocks) == ("b", 5)
    memory = RouterMemory(BOUNDS)
    memory.record("b", route, NOW - 1.3)  # credited for 1.25 s only
    assert kv(route, [make_digest("a", route.chain[:2]), make_digest("b")], memory).replica == "a"


def test_without_any_prefix_the_least_loaded_replica_gets_it():
    route = make_route(3)
    d = kv(
        route, [make_digest("a", running=2), make_digest("b", running=1, free_blocks=10), make_digest("c")]
    )
    assert (d.replica, d.outcome, d.ranking) == ("c", "no_prefix", ("c", "b", "a"))


def test_ties_break_on_load_then_free_blocks_then_name():
    route = make_route(2)
    held = route.chain
    assert kv(route, [make_digest("b", held), make_digest("a", held)]).replica == "a"
    assert kv(route, [make_digest("a", held, free_blocks=50), make_digest("b", held)]).replica == "b"
    # equal scores (2 - 1 == 1 - 0): the lower load wins
    assert kv(route, [make_digest("a", held, running=1), make_digest("b", held[:1])]).replica == "b"
    for _ in range(3):  # the same inputs, the same answer
        assert kv(route, [make_digest("c"), make_digest("a"), make_digest("b")]).ranking == ("a", "b", "c")


def test_a_session_sticks_to_its_replica_until_it_is_overloaded_or_gone():
    route = make_route(4, session="chat-1")
    memory = RouterMemory(BOUNDS)
    memory.record("b", route, NOW - 10)  # long ago: no chain credit left, only the session
    digests = [make_digest("a", running=2), make_digest("b", running=5)]
    d = kv(route, digests, memory)
    assert (d.replica, d.outcome) == ("b", "no_prefix")  # not the least loaded: its session's
    # b stale (its digest is late): kept there, without knowing what it holds
    d = kv(route, [make_digest("a", route.chain[:1]), make_digest("b", age_s=5)], memory)
    assert (d.replica, d.outcome) == ("b", "session")
    # overloaded: a queue and 5 more requests than a
    d = kv(route, [make_digest("a"), make_digest("b", running=8, waiting=5)], memory)
    assert d.replica == "a"
    assert kv(route, [make_digest("a"), make_digest("c")], memory).replica == "a"  # gone


def test_sessions_are_forgotten_least_recently_routed_first():
    memory = RouterMemory(RoutingBounds(session_capacity=2))
    for i, session in enumerate(["s1", "s2", "s1", "s3"]):
        memory.record(f"r{i}", make_route(1, session=session), NOW)
    assert [memory.session_replica(s) for s in ("s1", "s2", "s3")] == ["r2", None, "r3"]


def test_tenant_salts_never_cross():
    text = make_tokens(6)
    alice = route_key(HASHER, text, ChainKey("alice"))
    bob = route_key(HASHER, text, ChainKey("bob"))
    assert set(alice.chain).isdisjoint(bob.chain)
    d = kv(bob, [make_digest("a", alice.chain), make_digest("b", running=1)])
    assert (d.replica, d.best_matched_blocks, d.outcome) == ("a", 0, "no_prefix")
    # a published prefix of 2 blocks stays shared; the tenant's own blocks do not
    alice = route_key(HASHER, text, ChainKey("alice", 2 * 4))
    bob = route_key(HASHER, text, ChainKey("bob", 2 * 4))
    d = kv(bob, [make_digest("a", alice.chain), make_digest("b")])
    assert (d.replica, d.matched_blocks) == ("a", 2)


def test_round_robin_and_least_loaded_report_what_they_passed_over():
    route = make_route(3)
    digests = [make_digest("b", route.chain, running=4), make_digest("a", running=1), make_digest("c")]
    memory = RouterMemory(BOUNDS)
    picks = []
    for _ in range(4):
        d = choose(route, digests, "round-robin", NOW, memory, BOUNDS)
        picks.append((d.replica, d.matched_blocks, d.best_matched_blocks, d.outcome))
        memory.record(d.replica, route, NOW - 10)
    assert picks == [("a", 0, 3, "round_robin"), ("b", 3, 3, "round_robin"), ("c", 0, 3, "round_robin")] + [
        ("a", 0, 3, "round_robin")
    ]
    d = choose(route, digests, "least-loaded", NOW, memory, BOUNDS)
    assert (d.replica, d.outcome, d.ranking) == ("c", "least_loaded", ("c", "a", "b"))
    assert choose(None, digests, "kv", NOW).replica == "c"  # no route (an admin call): least loaded


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="round-robin"):
        choose(None, [make_digest("a")], "random", NOW)
    with pytest.raises(RuntimeError, match="at least one replica"):
        choose(None, [], "kv", NOW)
    with pytest.raises(RuntimeError, match="repeat"):
        choose(None, [make_digest("a"), make_digest("a")], "kv", NOW)
    with pytest.raises(ValueError, match="positive"):
        RoutingBounds.for_period(0)


def test_a_redirected_decision_counts_as_it_turned_out():
    route = make_route(4)
    d = kv(route, [make_digest("a", route.chain), make_digest("b", route.chain[:1]), make_digest("c")])
    assert d.redirected("a") is d
    b = d.redirected("b")
    assert (b.replica, b.matched_blocks, b.best_matched_blocks, b.outcome) == ("b", 1, 4, "load_fallback")
    none = kv(make_route(4, seed=9), [make_digest("a"), make_digest("b")])
    assert none.redirected("b").outcome == "no_prefix"
    rr = Decision("a", 0, 4, "round_robin", ("a", "b"), {"a": 0, "b": 4})
    assert rr.redirected("b").outcome == "round_robin"


def test_digest_round_trip_through_routing_stats():
    chain = [h[:8] for h in HASHER.chain(make_tokens(5))]
    # by block id, as the block manager keeps them: two empty blocks, one hash held by two blocks
    by_block = b"".join([chain[3], bytes(8), *chain, chain[0], bytes(8)])
    digest = ReplicaDigest.from_engine("r1", CacheDigest(by_block, 3, 1, 700, 1000, 8, 4), NOW)
    stats = {**digest.to_stats(), "pid": 42}  # a replica adds keys of its own
    assert len(stats[STATS_KEY]["hashes"]) == 5 * DIGEST_HASH_BYTES  # distinct hashes only
    back = ReplicaDigest.from_stats(stats)
    assert back == digest and back.num_cached_blocks == 5
    route = RouteKey(tuple(chain))
    assert kv(route, [back]).matched_blocks == 5
    assert kv(make_route(5, seed=1), [back]).matched_blocks == 0
    assert (back.num_running, back.num_waiting, back.num_free_blocks, back.max_num_seqs) == (3, 1, 700, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e.pop("hashes"), "hashes"),
        (lambda e: e.update(hashes=b"123"), "8-byte"),
        (lambda e: e.update(hashes=e["hashes"][8:] + e["hashes"][:8]), "sorted"),
        (lambda e: e.update(hashes=bytes(8) + e["hashes"]), "non-zero"),
        (lambda e: e.update(format=0), "format"),
        (lambda e: e.update(running=-1), "running"),
        (lambda e: e.update(name=None), "name"),
    ],
)
def test_malformed_digests_are_refused(change, message):
    stats = make_digest("r1", make_route(2).chain).to_stats()
    change(stats[STATS_KEY])
    with pytest.raises(ValueError, match=message):
        ReplicaDigest.from_stats(stats)
    with pytest.raises(ValueError, match="no 'kv_digest'"):
        ReplicaDigest.from_stats({"pid": 1})

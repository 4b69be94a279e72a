"""KVRequestRouter as Serve builds it (from the config's pickled class), driven with stand-in replicas: no cluster.

Serve's own calls are reproduced in order: choose_replicas (the ranks), on_request_routed (a replica accepted the
request), on_request_completed (it is over). The lead's end-to-end test runs the same class under a real Serve.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("ray.serve.request_router", reason="Ray Serve (the cluster extra) is not installed")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata  # noqa: E402
from ray.serve.request_router import PendingRequest, ReplicaID  # noqa: E402

from app.cluster.ray_router import KVRequestRouter, replica_router_config  # noqa: E402
from app.cluster.routing import RouteKey  # noqa: E402
from app.cluster.routing_ledger import LEDGER  # noqa: E402
from tests.cluster.factories import NOW, make_digest, make_route  # noqa: E402

DEPLOYMENT = DeploymentID(name="EngineReplica", app_name="pagedchat")
pytestmark = pytest.mark.anyio  # PendingRequest holds an asyncio future: built inside a running loop


@dataclass
class FakeReplica:
    """What the router reads of Serve's RunningReplica."""

    replica_id: ReplicaID
    routing_stats: dict[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = 8


def make_replica(name: str, **digest: Any) -> FakeReplica:
    held = digest.pop("held", ())
    stats = {**make_digest(name, held, **digest).to_stats(), "pid": 1} if digest or held else {}
    return FakeReplica(ReplicaID(name, DEPLOYMENT), stats)


def make_router(policy: str = "kv", clock: Callable[[], float] = lambda: NOW) -> KVRequestRouter:
    config = replica_router_config(policy, 0.25)
    cls = config.get_request_router_class()  # what the handle does: Serve pickled the class by value
    router = cls(DEPLOYMENT, DeploymentHandleSource.UNKNOWN, get_curr_time_s=clock)
    router.initialize_state(**config.request_router_kwargs)
    return router


def make_request(request_id: str, route: Any = None) -> PendingRequest:
    kwargs = {} if route is None else {"route": route}
    return PendingRequest(
        ["r", [1, 2]], kwargs, RequestMetadata(request_id, request_id, call_method="generate")
    )


async def ranks(
    router: KVRequestRouter, replicas: list[FakeReplica], request: PendingRequest
) -> list[list[str]]:
    ranked = await router.choose_replicas(replicas, request)
    return [[r.replica_id.unique_id for r in rank] for rank in ranked]


def test_the_config_carries_the_policy_and_the_period():
    config = replica_router_config("round-robin", 0.5)
    assert config.request_router_kwargs == {"policy": "round-robin", "period_s": 0.5}
    assert config.request_routing_stats_period_s == 0.5
    assert config.request_router_class == "app.cluster.ray_router.KVRequestRouter"
    with pytest.raises(ValueError, match="routing policy"):
        replica_router_config("random")
    with pytest.raises(TypeError):
        replica_router_config("kv", 0.25, no_such_bound=1)


async def test_ranks_put_the_longest_prefix_first_then_the_rest_by_load():
    LEDGER.clear()
    router = make_router()
    route = make_route(40, session="chat-1")
    replicas = [
        make_replica("a", running=1),
        make_replica("b", held=route.chain[:32], running=3),  # 32 blocks outweigh 3 requests (8 blocks each)
        make_replica("c"),
    ]
    request = make_request("q1", route)
    assert await ranks(router, replicas, request) == [["b"], ["c"], ["a"]]
    router.on_request_routed(request, replicas[1].replica_id, None)
    b = LEDGER.snapshot()["b"]
    assert (b.requests["longest_prefix"], b.matched_blocks, b.best_matched_blocks, b.route_blocks) == (
        1,
        32,
        32,
        40,
    )
    assert router.memory.in_flight("b") == 1 and router.memory.session_replica("chat-1") == "b"
    router.on_request_completed(replicas[1].replica_id, "q1")
    assert router.memory.in_flight("b") == 0


async def test_a_request_serve_sent_elsewhere_counts_as_a_load_fallback():
    LEDGER.clear()
    router = make_router()
    route = make_route(20)
    replicas = [make_replica("a", held=route.chain), make_replica("b")]
    request = make_request("q1", route)
    assert await ranks(router, replicas, request) == [["a"], ["b"]]
    # a was at its max_ongoing_requests: Serve fell through to the next rank
    router.on_request_completed(replicas[0].replica_id, "q1")  # the rejected send to a, reported first
    router.on_request_routed(request, replicas[1].replica_id, None)
    b = LEDGER.snapshot()["b"]
    assert (b.requests["load_fallback"], b.matched_blocks, b.best_matched_blocks) == (1, 0, 20)
    assert (router.memory.in_flight("a"), router.memory.in_flight("b")) == (0, 1)
    # the chain is now credited to b, where it is being computed (a, holding it all, still comes first)
    assert await ranks(router, replicas, make_request("q2", route)) == [["a"], ["b"]]
    assert await ranks(router, [replicas[1], make_replica("c")], make_request("q3", route)) == [["b"], ["c"]]


async def test_requests_in_flight_weigh_on_a_replica_before_its_digest_shows_them():
    LEDGER.clear()
    router = make_router()
    replicas = [make_replica("a"), make_replica("b")]
    for i in range(3):
        route = make_route(2, seed=i)
        request = make_request(f"q{i}", route)
        first = (await ranks(router, replicas, request))[0][0]
        router.on_request_routed(request, ReplicaID(first, DEPLOYMENT), None)
    assert [router.memory.in_flight(n) for n in "ab"] == [2, 1]  # a, b, a: by load, ties by name
    assert {n: s.requests["no_prefix"] for n, s in LEDGER.snapshot().items()} == {"a": 2, "b": 1}


async def test_a_request_longer_than_the_staleness_period_is_credited_again_when_it_completes():
    """No digest shows the blocks (none was pulled): the router's own credit, from routing, runs out while the
    request still runs, and is renewed for another period when it completes (its blocks are cached from then on)."""
    now = [NOW]
    router = make_router(clock=lambda: now[0])
    replicas, route = [make_replica("a"), make_replica("b")], make_route(20)  # 20 blocks outweigh a request
    first = make_request("q1", route)
    assert (await ranks(router, replicas, first))[0] == ["a"]
    router.on_request_routed(first, replicas[0].replica_id, None)
    # credited: a despite its load
    assert (await ranks(router, replicas, make_request("q2", route)))[0] == ["a"]
    now[0] += router.bounds.stale_after_s + 0.1
    assert (await ranks(router, replicas, make_request("q3", route)))[0] == ["b"]  # run out: by load
    router.on_request_completed(replicas[0].replica_id, "q1")
    now[0] += router.bounds.stale_after_s - 0.1
    other = make_request("q4", make_route(1, seed=9))
    assert (await ranks(router, replicas, other))[0] == ["a"]  # loads tie again: by name
    router.on_request_routed(other, replicas[0].replica_id, None)
    # credited again, despite q4
    assert (await ranks(router, replicas, make_request("q5", route)))[0] == ["a"]
    now[0] += 0.2
    assert (await ranks(router, replicas, make_request("q6", route)))[0] == ["b"]


async def test_calls_without_a_route_go_least_loaded_and_are_not_counted():
    LEDGER.clear()
    router = make_router()
    replicas = [make_replica("a", running=2), make_replica("b", running=1)]
    request = make_request("admin")
    assert await ranks(router, replicas, request) == [["b"], ["a"]]
    router.on_request_routed(request, replicas[1].replica_id, None)
    router.on_request_completed(replicas[1].replica_id, "admin")
    assert LEDGER.snapshot() == {} and router.memory.in_flight("b") == 0


async def test_replicas_without_stats_or_with_bad_stats_are_routed_by_load_only(caplog):
    router = make_router()
    route = make_route(3)
    fresh = make_replica("a")  # {}: Serve has not pulled its stats yet
    bad = FakeReplica(ReplicaID("b", DEPLOYMENT), {"kv_digest": {"format": 1}})
    wrong_name = FakeReplica(ReplicaID("c", DEPLOYMENT), make_digest("z", route.chain).to_stats())
    assert await ranks(router, [fresh, bad, wrong_name], make_request("q1", route)) == [["a"], ["b"], ["c"]]
    assert "replica b: unusable routing stats" in caplog.text
    assert "names replica 'z'" in caplog.text
    assert router.digest(bad) is router.digest(bad)  # decoded (and logged) once per stats update


async def test_a_route_of_the_wrong_type_fails_the_call_instead_of_hanging_it():
    router = make_router()
    request = make_request("q1", route=("not", "a", "route"))
    assert await router.choose_replicas(
        [make_replica("a")], request
    )  # Serve's loop then sees the request done
    with pytest.raises(TypeError, match="must be a RouteKey, got tuple"):
        request.future.result()


async def test_a_dead_replica_is_forgotten():
    router = make_router()
    route = RouteKey(make_route(2).chain, "chat-1")
    request = make_request("q1", route)
    replicas = [make_replica("a"), make_replica("b")]
    assert (await ranks(router, replicas, request))[0] == ["a"]
    router.on_request_routed(request, replicas[0].replica_id, None)
    router.on_replica_actor_died(replicas[0].replica_id)
    assert router.memory.in_flight("a") == 0
    router.on_request_completed(replicas[0].replica_id, "q1")  # its failed reply, reported after the death
    assert await ranks(router, [replicas[1]], make_request("q2", route)) == [["b"]]

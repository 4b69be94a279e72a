"""The KV-aware policy (`app.cluster.routing`) as a Ray Serve request router, running in the ingress's handle.

Serve calls `choose_replicas` for each request (again after a backoff when no replica took it): we rank every
candidate, the chosen one first, each in a rank of its own, so Serve still falls through to the next best when the
chosen replica is at its max_ongoing_requests. `on_request_routed` (Serve's replica accepted the request) is where
the decision counts: the ledger records it as it turned out, the memory learns the session's replica and the
chain. A call without a `route` keyword (an admin call) goes to the least loaded replica and is not counted.

Serve pickles this module by value into the handle (RequestRouterConfig), so it keeps no state of its own at
module level: the ledger is reached through `app.cluster.routing_ledger`, imported by reference.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from app.cluster import routing_ledger
from app.cluster.digest import ReplicaDigest
from app.cluster.routing import Decision, RouteKey, RoutingBounds, check_policy, choose
from app.cluster.routing_memory import RouterMemory

logger = logging.getLogger(__name__)

MAX_PENDING = 1024  # decisions awaiting Serve's answer, early completions; the oldest are dropped past this


def replica_router_config(policy: str, period_s: float = 0.25, **bounds: Any) -> RequestRouterConfig:
    """The deployment's RequestRouterConfig: KVRequestRouter under `policy` (kv, round-robin, least-loaded),
    replicas' routing stats pulled every `period_s`; `bounds` override RoutingBounds fields."""
    check_policy(policy)
    RoutingBounds.for_period(period_s, **bounds)  # ValueError / TypeError now, not in the handle later
    return RequestRouterConfig(
        request_router_class=KVRequestRouter,
        request_router_kwargs={"policy": policy, "period_s": period_s, **bounds},
        request_routing_stats_period_s=period_s,
        request_routing_stats_timeout_s=max(10 * period_s, 5.0),
    )


class KVRequestRouter(RequestRouter):
    """Ranks replicas with `routing.choose` from their digests (`record_routing_stats`) and this router's memory."""

    def initialize_state(self, policy: str = "kv", period_s: float = 0.25, **bounds: Any) -> None:
        """Serve calls this with the config's request_router_kwargs."""
        self.policy = check_policy(policy)
        self.bounds = RoutingBounds.for_period(period_s, **bounds)
        self.memory = RouterMemory(self.bounds)
        self._digests: dict[str, tuple[dict, ReplicaDigest]] = {}  # replica -> (its stats dict, digest)
        # internal request id -> the latest decision for it and its route, until Serve reports where it went
        self._pending: OrderedDict[str, tuple[Decision, RouteKey]] = OrderedDict()
        # internal request id -> the replica it is in flight on, and its chain (credited again at completion)
        self._routed: dict[str, tuple[str, tuple[bytes, ...]]] = {}
        # (request id, replica) completions that came before their on_request_routed: a send the replica rejected,
        # or a reply done before Serve reported it accepted; such a request is not counted in flight
        self._completed_early: OrderedDict[tuple[str, str], None] = OrderedDict()

    def digest(self, replica: RunningReplica) -> ReplicaDigest:
        """The replica's digest from its latest routing stats (decoded once per stats update)."""
        name = replica.replica_id.unique_id
        stats = replica.routing_stats
        cached = self._digests.get(name)
        if cached is not None and cached[0] is stats:
            return cached[1]
        digest = ReplicaDigest.unknown(name)
        if stats:  # {} until Serve has pulled the replica's first stats
            try:
                digest = ReplicaDigest.from_stats(stats)
                if digest.name != name:
                    raise ValueError(f"the digest names replica {digest.name!r}")
            except ValueError as exc:
                logger.error("replica %s: unusable routing stats, routed by load only: %s", name, exc)
                digest = ReplicaDigest.unknown(name)
        self._digests[name] = (stats, digest)  # held, so a new stats dict can never reuse its identity
        return digest

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        """Every candidate, best first, one to a rank."""
        if not candidate_replicas:
            return []
        target = pending_request.kwargs.get("target") if pending_request is not None else None
        if (
            target is not None
        ):  # a call for one replica (the admin page's pool map, a purge): that one or none
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            if not chosen and not pending_request.future.done():
                pending_request.future.set_exception(LookupError(f"replica {target} is not serving"))
            return [chosen or candidate_replicas]
        route = pending_request.kwargs.get("route") if pending_request is not None else None
        if route is not None and not isinstance(route, RouteKey):
            # raising here would end Serve's routing task and leave the caller waiting forever: fail the call
            if not pending_request.future.done():
                pending_request.future.set_exception(
                    TypeError(f"the route keyword must be a RouteKey, got {type(route).__name__}")
                )
            return [candidate_replicas]
        by_name = {r.replica_id.unique_id: r for r in candidate_replicas}
        digests = [self.digest(r) for r in candidate_replicas]
        decision = choose(route, digests, self.policy, self._get_curr_time_s(), self.memory, self.bounds)
        if route is not None and pending_request is not None:
            request_id = pending_request.metadata.internal_request_id
            self._pending[request_id] = (decision, route)
            self._pending.move_to_end(request_id)
            _bound(self._pending)
        return [[by_name[name]] for name in decision.ranking]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        """Serve's replica accepted the request: count the decision as it turned out and remember it."""
        request_id = pending_request.metadata.internal_request_id
        entry = self._pending.pop(request_id, None)
        if entry is None:  # an admin call
            return
        decision, route = entry
        name = replica_id.unique_id
        decision = decision.redirected(name)
        routing_ledger.LEDGER.record(decision, len(route.chain))
        self.memory.record(name, route, self._get_curr_time_s())
        if self._completed_early.pop((request_id, name), None) is None and request_id not in self._routed:
            self._routed[request_id] = (name, route.chain)
            self.memory.start(name)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """A send is over (done, failed, cancelled or rejected): the request no longer loads that replica."""
        name = replica_id.unique_id
        routed = self._routed.get(internal_request_id)
        if routed is not None and routed[0] == name:
            del self._routed[internal_request_id]
            self.memory.finish(name)
            self.memory.credit(name, routed[1], self._get_curr_time_s())
        else:
            self._completed_early[internal_request_id, name] = None
            _bound(self._completed_early)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.unique_id for r in replicas}
        for name in [n for n in self._digests if n not in live]:
            self._forget(name)

    def _forget(self, name: str) -> None:
        self._digests.pop(name, None)
        self.memory.forget_replica(name)
        for request_id in [i for i, (n, _) in self._routed.items() if n == name]:
            del self._routed[request_id]


def _bound(entries: OrderedDict) -> None:
    while len(entries) > MAX_PENDING:
        entries.popitem(last=False)

"""What /metrics says of a replica set beside each replica's engine series: how many replicas were asked for and
serve, whether each one is up, and the ingress's routing decisions per replica and outcome."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from app.metrics.engine_metrics import Families
from engine.core.stats import EngineStats


class RoutingCounts(Protocol):
    """What the services read of one replica's routing counts (app/cluster/routing_ledger.py's ReplicaRouting)."""

    @property
    def requests(self) -> Mapping[str, int]:
        """Outcome -> requests routed to the replica with it."""

    @property
    def matched_blocks(self) -> int:
        """Leading blocks the replica held, summed over those requests."""

    @property
    def route_blocks(self) -> int:
        """The requests' full blocks, summed."""


@dataclass(frozen=True)
class ReplicaHealth:
    """One replica as the ingress's census last saw it."""

    name: str
    up: bool  # serving (answered the last census, its engine healthy)


@dataclass(frozen=True)
class ReplicaSetReport:
    """A replica set for one scrape: plain data the cluster layer fills, the services render."""

    asked: int
    replicas: Sequence[ReplicaHealth]
    stats: Sequence[tuple[str, EngineStats]]  # (replica, its engine stats) of each serving replica
    routing: Mapping[str, RoutingCounts]  # replica -> its routing counts (gone replicas kept: totals)


class ClusterCollector(Collector):
    """Each replica set's own series, from the last reports set (none before one is), labelled by model: the
    default model's set (`--model`) and those of the other loaded models (several models with `--replicas`)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name  # the default model's
        self.report: ReplicaSetReport | None = None  # the default model's replica set
        # (model, its replica set) of the other loaded models
        self.others: Sequence[tuple[str, ReplicaSetReport]] = ()

    def collect(self) -> Iterator[Metric]:
        out = Families()
        if self.report is not None:
            _add_report(out, self.model_name, self.report)
        for model, report in self.others:
            _add_report(out, model, report)
        yield from out


def _add_report(out: Families, model: str, report: ReplicaSetReport) -> None:
    of_model = {"model_name": model}
    out.add("gauge", "replicas_asked", "Engine replicas asked for (--replicas).", of_model, report.asked)
    up = sum(1 for r in report.replicas if r.up)
    out.add("gauge", "replicas_ready", "Engine replicas serving.", of_model, up)
    for replica in report.replicas:
        doc = "Whether an engine replica serves (1) or is starting or unreachable (0)."
        out.add("gauge", "replica_up", doc, {**of_model, "replica": replica.name}, int(replica.up))
    for name, counts in sorted(report.routing.items()):
        of_replica = {**of_model, "replica": name}
        for outcome, num in counts.requests.items():
            out.add(
                "counter",
                "routed_requests",
                "Requests the ingress routed to a replica, by the router's outcome (longest_prefix, "
                "load_fallback, no_prefix, session, round_robin, least_loaded).",
                {**of_replica, "outcome": outcome},
                num,
            )
        out.add(
            "counter",
            "routed_matched_blocks",
            "Leading blocks of the routed requests that their replica held in its cache when routed.",
            of_replica,
            counts.matched_blocks,
        )
        out.add(
            "counter",
            "routed_route_blocks",
            "Full blocks of the requests routed to the replica (what a perfect cache would have held).",
            of_replica,
            counts.route_blocks,
        )

"""What `bench multiturn --replicas` reads from a replica set's /metrics (prometheus_client's text parser): routing
decisions per (replica, outcome) and per-replica engine series, and the differences over a run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from app.cluster.routing import OUTCOMES

# the decisions of the kv policy (the others: round_robin, least_loaded); `session`: kept on a chat session's replica
# although another showed more of its blocks, so not to the longest prefix
KV_OUTCOMES = ("longest_prefix", "load_fallback", "no_prefix", "session")
ROUTED = "routed_requests_total"
NAME_PREFIXES = ("pagedchat:", "pagedchat_")  # the app's metrics use "pagedchat:"; the contract spelt "_"

RoutedCounts = dict[tuple[str, str], float]  # (replica, outcome) -> requests


def base_name(sample_name: str) -> str:
    """A sample's name without the project's prefix: `pagedchat:routed_requests_total` -> `routed_requests_total`."""
    for prefix in NAME_PREFIXES:
        if sample_name.startswith(prefix):
            return sample_name[len(prefix) :]
    return sample_name


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called `name` (without the prefix) in the exposition `text`."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ValueError(f"/metrics is not Prometheus text: {exc}") from exc
    return [
        (dict(sample.labels), float(sample.value))
        for family in families
        for sample in family.samples
        if base_name(sample.name) == name
    ]


def routed_counts(text: str) -> RoutedCounts:
    """Routing decisions so far, per (replica, outcome); empty for a server that routes nothing (one process)."""
    counts: RoutedCounts = {}
    for labels, value in _samples(text, ROUTED):
        if "replica" not in labels or "outcome" not in labels:
            raise ValueError(f"{ROUTED} sample without replica and outcome labels: {labels}")
        key = (labels["replica"], labels["outcome"])
        counts[key] = counts.get(key, 0.0) + value
    return counts


def by_replica(text: str, name: str) -> dict[str, float]:
    """The value of series `name` (e.g. `num_requests_running`, `prefix_cache_hits_total`) per `replica` label,
    summed over its other labels; samples without a replica label are left out."""
    out: dict[str, float] = {}
    for labels, value in _samples(text, name):
        if "replica" in labels:
            out[labels["replica"]] = out.get(labels["replica"], 0.0) + value
    return out


def delta(
    before: Mapping[Any, float], after: Mapping[Any, float], *, allow_reset: bool = False
) -> dict[Any, float]:
    """after - before per key (a key new in `after` counts from 0).

    A counter that went down has started over: with `allow_reset` (a replica's engine counters, after Ray restarted
    it) its whole value after counts, as Prometheus's increase() does; else RuntimeError (the ingress's own counters
    go down only when the server restarted, and then the difference means nothing).
    """
    out = {}
    for key, value in after.items():
        diff = value - before.get(key, 0.0)
        if diff < 0:
            if not allow_reset:
                raise RuntimeError(
                    f"counter {key} went down from {before[key]} to {value}: did the server restart?"
                )
            diff = value
        out[key] = diff
    return out


def routing_summary(counts: Mapping[tuple[str, str], float]) -> dict[str, Any]:
    """Requests routed, per outcome and per replica, and the share that went to the replica with the longest
    cached prefix: of all requests, and of those for which some replica held a prefix (longest_prefix +
    load_fallback). NaN where the policy does not rank by prefix (round-robin, least-loaded) or nothing was
    routed."""
    by_outcome = dict.fromkeys(OUTCOMES, 0)
    replicas: dict[str, dict[str, int]] = {}
    for (replica, outcome), value in sorted(counts.items()):
        by_outcome[outcome] = by_outcome.get(outcome, 0) + round(value)
        per = replicas.setdefault(replica, {})
        per[outcome] = per.get(outcome, 0) + round(value)
    total = sum(by_outcome.values())
    ranked = sum(by_outcome[o] for o in KV_OUTCOMES)
    prefixed = by_outcome["longest_prefix"] + by_outcome["load_fallback"]
    return {
        "num_routed": total,
        "by_outcome": by_outcome,
        "by_replica": {r: {"num_routed": sum(per.values()), **per} for r, per in replicas.items()},
        "longest_prefix_pct": 100.0 * by_outcome["longest_prefix"] / ranked if ranked else math.nan,
        "longest_prefix_pct_of_prefixed": (
            100.0 * by_outcome["longest_prefix"] / prefixed if prefixed else math.nan
        ),
    }


def replica_hit_pct(hits: Mapping[str, float], queries: Mapping[str, float]) -> dict[str, float]:
    """Per replica: prompt tokens served from its prefix cache, % of those it looked up (NaN: it looked up none)."""
    return {r: 100.0 * hits.get(r, 0.0) / q if q else math.nan for r, q in sorted(queries.items())}

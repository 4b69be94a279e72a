"""bench/replicas/metrics.py: routing decisions and per-replica series out of real Prometheus text."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from app.cluster.routing import OUTCOMES
from app.cluster.routing_ledger import ReplicaRouting
from app.metrics.cluster_metrics import ReplicaHealth, ReplicaSetReport
from app.metrics.metrics import Metrics
from bench.replicas.metrics import (
    by_replica,
    delta,
    replica_hit_pct,
    routed_counts,
    routing_summary,
)
from tests.app.stats_factories import make_stats


def make_exposition(
    routed: dict[tuple[str, str], int],
    running: dict[str, int],
    hits: dict[str, int],
    prefix: str = "pagedchat:",
) -> str:
    """What a replica set's /metrics could say, written by prometheus_client itself (with _created samples)."""
    registry = CollectorRegistry()
    counter = Counter(prefix + "routed_requests", "decisions", ["replica", "outcome"], registry=registry)
    for (replica, outcome), n in routed.items():
        counter.labels(replica, outcome).inc(n)
    gauge = Gauge(prefix + "num_requests_running", "running", ["model_name", "replica"], registry=registry)
    for replica, n in running.items():
        gauge.labels("tiny", replica).set(n)
    gauge.labels("other-model", "r0").set(100)  # a second model label on the same replica is summed
    hits_counter = Counter(prefix + "prefix_cache_hits", "hits", ["model_name", "replica"], registry=registry)
    for replica, n in hits.items():
        hits_counter.labels("tiny", replica).inc(n)
    Gauge(prefix + "num_requests_waiting", "no replica label", ["model_name"], registry=registry).labels(
        "tiny"
    ).set(7)
    return generate_latest(registry).decode()


ROUTED = {
    ("r0", "longest_prefix"): 6,
    ("r1", "longest_prefix"): 3,
    ("r1", "load_fallback"): 2,
    ("r0", "no_prefix"): 1,
}


@pytest.mark.parametrize("prefix", ["pagedchat:", "pagedchat_"])
def test_routed_counts_and_per_replica_series_are_read_whatever_the_prefix_separator(prefix):
    text = make_exposition(ROUTED, {"r0": 2, "r1": 5}, {"r0": 64, "r1": 16}, prefix)
    assert routed_counts(text) == {key: float(n) for key, n in ROUTED.items()}
    assert by_replica(text, "num_requests_running") == {"r0": 102.0, "r1": 5.0}
    assert by_replica(text, "prefix_cache_hits_total") == {"r0": 64.0, "r1": 16.0}
    assert by_replica(text, "num_requests_waiting") == {}  # no replica label: a plain process's gauge


def test_a_plain_process_routes_nothing():
    assert routed_counts(make_exposition({}, {}, {})) == {}


def test_text_that_is_not_prometheus_is_a_clear_error():
    with pytest.raises(ValueError, match="/metrics is not Prometheus text"):
        routed_counts("this is { not metrics")


def test_a_routed_sample_without_its_labels_is_refused():
    text = '# TYPE pagedchat:routed_requests counter\npagedchat:routed_requests_total{replica="r0"} 3\n'
    with pytest.raises(ValueError, match="without replica and outcome labels"):
        routed_counts(text)


def test_delta_counts_new_keys_from_zero_and_refuses_a_counter_that_went_down():
    before = {"a": 3.0, "b": 10.0}
    assert delta(before, {"a": 5.0, "b": 10.0, "c": 2.0}) == {"a": 2.0, "b": 0.0, "c": 2.0}
    with pytest.raises(RuntimeError, match="went down from 10.0 to 4.0"):
        delta(before, {"b": 4.0})
    # a restarted replica's engine counters start over: the value after is what it counted since
    assert delta(before, {"a": 4.0, "b": 4.0}, allow_reset=True) == {"a": 1.0, "b": 4.0}


def test_routing_summary_shares_of_the_longest_prefix():
    summary = routing_summary({key: float(n) for key, n in ROUTED.items()})
    assert summary["num_routed"] == 12
    assert summary["by_outcome"] == {
        "longest_prefix": 9,
        "load_fallback": 2,
        "no_prefix": 1,
        "session": 0,
        "round_robin": 0,
        "least_loaded": 0,
    }
    assert summary["by_replica"] == {
        "r0": {"num_routed": 7, "longest_prefix": 6, "no_prefix": 1},
        "r1": {"num_routed": 5, "longest_prefix": 3, "load_fallback": 2},
    }
    assert summary["longest_prefix_pct"] == pytest.approx(100 * 9 / 12)
    assert summary["longest_prefix_pct_of_prefixed"] == pytest.approx(100 * 9 / 11)


def test_policies_that_do_not_rank_by_prefix_have_no_longest_prefix_share():
    summary = routing_summary({("r0", "round_robin"): 4.0, ("r1", "round_robin"): 4.0})
    assert summary["num_routed"] == 8 and summary["by_outcome"]["round_robin"] == 8
    assert math.isnan(summary["longest_prefix_pct"]) and math.isnan(summary["longest_prefix_pct_of_prefixed"])


def test_replica_hit_pct():
    pct = replica_hit_pct({"r0": 30.0}, {"r0": 40.0, "r1": 0.0})
    assert pct["r0"] == pytest.approx(75.0) and math.isnan(pct["r1"])


def test_the_apps_own_replica_metrics_read_back_by_name():
    """What bench reads is what the app writes: routed counts and per-replica series of a real Metrics scrape."""
    metrics = Metrics("tiny")
    outcomes = {"longest_prefix": 4, "load_fallback": 1, "session": 2}
    metrics.set_replica_set(
        ReplicaSetReport(
            asked=2,
            replicas=[ReplicaHealth("r0", True), ReplicaHealth("r1", True)],
            stats=[
                ("r0", make_stats(num_running=1, prefix_query_tokens=80, prefix_hit_tokens=48)),
                ("r1", make_stats(num_waiting=2, prefix_query_tokens=40)),
            ],
            routing={
                "r0": ReplicaRouting({o: outcomes.get(o, 0) for o in OUTCOMES}, 4, 12, 12, 20),
                "r1": ReplicaRouting({o: int(o == "no_prefix") for o in OUTCOMES}, 1, 0, 0, 3),
            },
        )
    )
    text = metrics.render().decode()
    assert {k: v for k, v in routed_counts(text).items() if v} == {
        ("r0", "longest_prefix"): 4.0,
        ("r0", "load_fallback"): 1.0,
        ("r0", "session"): 2.0,
        ("r1", "no_prefix"): 1.0,
    }
    assert by_replica(text, "num_requests_running") == {"r0": 1.0, "r1": 0.0}
    assert by_replica(text, "num_requests_waiting") == {"r0": 0.0, "r1": 2.0}
    hits, queries = (
        by_replica(text, "prefix_cache_hits_total"),
        by_replica(text, "prefix_cache_queries_total"),
    )
    assert replica_hit_pct(hits, queries) == {"r0": 60.0, "r1": 0.0}
    summary = routing_summary(routed_counts(text))
    assert summary["by_outcome"]["session"] == 2 and summary["num_routed"] == 8
    assert summary["longest_prefix_pct"] == pytest.approx(100 * 4 / 8)

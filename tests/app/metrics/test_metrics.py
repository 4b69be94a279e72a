"""The Prometheus exposition of EngineStats: prefix hits by tier, the loading gauge and the disk tier's metrics; with
replicas, each replica's series (a `replica` label), their health and the routing decisions."""

from __future__ import annotations

from dataclasses import fields

from prometheus_client.parser import text_string_to_metric_families

from app.cluster.routing import OUTCOMES
from app.cluster.routing_ledger import ReplicaRouting
from app.metrics.cluster_metrics import ReplicaHealth, ReplicaSetReport
from app.metrics.engine_metrics import TIER_COUNTERS, TIER_GAUGES
from app.metrics.metrics import Metrics
from engine.core.stats import SpecStats, StepTiming
from engine.core.tier import TierStats
from tests.app.stats_factories import make_stats, make_tier_stats

MODEL = {"model_name": "tiny"}


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape by (name, sorted labels)."""
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped: dict, name: str, **labels: str) -> float:
    return scraped[("pagedchat:" + name, tuple(sorted({**MODEL, **labels}.items())))]


def scrape(**overrides) -> dict:
    metrics = Metrics("tiny")
    metrics.set_engine_stats(make_stats(**overrides))
    return samples(metrics)


def test_prefix_hits_split_into_ram_and_disk_and_the_total_keeps_its_name():
    scraped = scrape(prefix_query_tokens=500, prefix_hit_tokens=320, disk_hit_tokens=128, num_loading=3)
    assert value(scraped, "prefix_cache_queries_total") == 500
    assert value(scraped, "prefix_cache_hits_total") == 320
    assert value(scraped, "prefix_cache_hits_by_tier_total", tier="ram") == 192
    assert value(scraped, "prefix_cache_hits_by_tier_total", tier="disk") == 128
    assert value(scraped, "num_requests_loading") == 3


def test_step_timings_are_counted_per_batch_size_and_split_into_matmul_attention_and_rest():
    timings = (
        StepTiming(batch_size=1, num_steps=100, step_s=1.5, matmul_s=1.25, attention_s=0.125),
        StepTiming(batch_size=64, num_steps=3, step_s=0.75, matmul_s=0.5, attention_s=0.0625),
    )
    scraped = scrape(step_timings=timings)
    assert value(scraped, "decode_steps_timed_total", batch_size="1") == 100
    assert value(scraped, "decode_steps_timed_total", batch_size="64") == 3
    parts = {
        p: value(scraped, "decode_step_seconds_total", batch_size="1", part=p)
        for p in ("matmul", "attention")
    }
    assert parts == {"matmul": 1.25, "attention": 0.125}
    assert value(scraped, "decode_step_seconds_total", batch_size="1", part="rest") == 0.125
    assert value(scraped, "decode_step_seconds_total", batch_size="64", part="rest") == 0.1875
    # without --step-timing: no such series at all
    assert not any("decode_step" in name for name, _ in scrape())


def test_a_tier_reports_every_gauge_and_counter():
    scraped = scrape(tier=make_tier_stats(num_write_drops=5, num_write_errors=1))
    expected = {
        "kv_disk_enabled": 1,
        "kv_disk_capacity_bytes": 1024**2,
        "kv_disk_used_bytes": 655360,
        "kv_disk_blocks": 10,
        "kv_disk_files": 12,
        "kv_disk_write_queue_depth": 2,
        "kv_disk_write_lag_seconds": 0.25,
        "kv_disk_writes_total": 30,
        "kv_disk_write_drops_total": 5,
        "kv_disk_write_errors_total": 1,
        "kv_disk_loads_total": 4,
        "kv_disk_loaded_blocks_total": 10,
        "kv_disk_load_failures_total": 1,
        "kv_disk_load_seconds_total": 0.5,
        "kv_disk_evictions_total": 20,
        "kv_disk_lookups_total": 40,
        "kv_disk_lookups_evicted_total": 2,
    }
    assert {name: value(scraped, name) for name in expected} == expected
    assert {k[0] for k in scraped if k[0].startswith("pagedchat:kv_disk_")} == {
        "pagedchat:" + n for n in expected
    }
    exposed = {attr for _, _, attr in (*TIER_GAUGES, *TIER_COUNTERS)}
    assert exposed == {f.name for f in fields(TierStats)} - {
        "enabled"
    }  # a new TierStats field needs a metric


def test_a_tier_turned_off_keeps_its_counters_but_says_it_is_off():
    scraped = scrape(tier=make_tier_stats(enabled=False, num_write_errors=1))
    assert value(scraped, "kv_disk_enabled") == 0
    assert value(scraped, "kv_disk_write_errors_total") == 1


def test_no_tier_says_off_and_invents_no_numbers():
    scraped = scrape(prefix_query_tokens=100, prefix_hit_tokens=40)
    assert value(scraped, "kv_disk_enabled") == 0
    assert [k[0] for k in scraped if k[0].startswith("pagedchat:kv_disk_")] == ["pagedchat:kv_disk_enabled"]
    assert value(scraped, "prefix_cache_hits_by_tier_total", tier="ram") == 40
    assert value(scraped, "prefix_cache_hits_by_tier_total", tier="disk") == 0


# ---- a replica set: the engine series per replica, the replicas' health, the routing decisions -----------------
def make_report(**overrides) -> ReplicaSetReport:
    """Two replicas asked for: r0 serves, r1 is restarting (no stats); r0 got requests, so did r-dead before it died."""
    values = dict(
        asked=2,
        replicas=[ReplicaHealth("r0", True), ReplicaHealth("r1", False)],
        stats=[
            ("r0", make_stats(num_running=2, num_waiting=1, prefix_query_tokens=96, prefix_hit_tokens=64))
        ],
        routing={
            "r0": make_routing(longest_prefix=5, load_fallback=1, no_prefix=2, matched=20, blocks=32),
            "r1": make_routing(),
            "r-dead": make_routing(no_prefix=3, blocks=9),
        },
    )
    values.update(overrides)
    return ReplicaSetReport(**values)


def make_routing(matched: int = 0, blocks: int = 0, **requests: int) -> ReplicaRouting:
    return ReplicaRouting({o: requests.get(o, 0) for o in OUTCOMES}, 0, matched, matched, blocks)


def test_a_replica_sets_engine_series_carry_the_replica_and_one_process_keeps_its_names():
    metrics = Metrics("tiny")
    metrics.set_replica_set(
        make_report(
            stats=[
                ("r0", make_stats(num_running=2, prefix_hit_tokens=64)),
                ("r1", make_stats(num_waiting=3, tier=make_tier_stats())),
            ]
        )
    )
    scraped = samples(metrics)
    assert value(scraped, "num_requests_running", replica="r0") == 2
    assert value(scraped, "num_requests_running", replica="r1") == 0
    assert value(scraped, "num_requests_waiting", replica="r1") == 3
    assert value(scraped, "prefix_cache_hits_total", replica="r0") == 64
    assert value(scraped, "prefix_cache_hits_by_tier_total", replica="r1", tier="disk") == 0
    assert value(scraped, "kv_disk_enabled", replica="r0") == 0  # each replica's own tier
    assert value(scraped, "kv_disk_writes_total", replica="r1") == 30
    engine_series = [
        dict(labels)
        for name, labels in scraped
        if name.startswith("pagedchat:")
        and not name.startswith(("pagedchat:replica", "pagedchat:routed"))
        and "model_name" in dict(labels)
        and not name.endswith(("_bucket", "_count", "_sum", "_created"))
    ]
    assert engine_series and all(labels.get("replica") in ("r0", "r1") for labels in engine_series)

    single = scrape(num_running=2)  # one process: no replica label anywhere, no replica series
    assert value(single, "num_requests_running") == 2
    assert not [key for key in single if "replica" in dict(key[1]) or "replica" in key[0]]


def test_a_replica_set_reports_its_health_and_the_routing_decisions():
    metrics = Metrics("tiny")
    metrics.set_replica_set(make_report())
    scraped = samples(metrics)
    assert value(scraped, "replicas_asked") == 2 and value(scraped, "replicas_ready") == 1
    up = {
        dict(labels)["replica"]: v for (name, labels), v in scraped.items() if name == "pagedchat:replica_up"
    }
    assert up == {"r0": 1, "r1": 0}
    routed = {
        (dict(labels)["replica"], dict(labels)["outcome"]): v
        for (name, labels), v in scraped.items()
        if name == "pagedchat:routed_requests_total"
    }
    assert len(routed) == 3 * len(OUTCOMES)  # every outcome of every replica, 0s included, the dead one kept
    assert {k: v for k, v in routed.items() if v} == {
        ("r0", "longest_prefix"): 5,
        ("r0", "load_fallback"): 1,
        ("r0", "no_prefix"): 2,
        ("r-dead", "no_prefix"): 3,
    }
    assert value(scraped, "routed_matched_blocks_total", replica="r0") == 20
    assert value(scraped, "routed_route_blocks_total", replica="r-dead") == 9
    # r1 answers no census: no engine series for it (not zeros that would read as an idle replica)
    assert value(scraped, "num_requests_running", replica="r0") == 2
    assert ("pagedchat:num_requests_running", (("model_name", "tiny"), ("replica", "r1"))) not in scraped


def test_a_replica_set_with_none_serving_still_says_so():
    metrics = Metrics("tiny")
    metrics.set_replica_set(
        make_report(replicas=[ReplicaHealth("r0", False), ReplicaHealth("r1", False)], stats=[], routing={})
    )
    scraped = samples(metrics)
    assert (value(scraped, "replicas_asked"), value(scraped, "replicas_ready")) == (2, 0)
    assert not [key for key in scraped if key[0] == "pagedchat:num_requests_running"]


def test_each_loaded_models_replica_set_reports_its_health_and_routing_under_its_name():
    """Several models with --replicas: every loaded model is a replica set of its own, and each one's series carry
    its model_name beside the replica's."""
    metrics = Metrics("tiny")
    metrics.set_replica_set(make_report())
    coder = make_report(
        replicas=[ReplicaHealth("c0", True), ReplicaHealth("c1", True)],
        stats=[("c0", make_stats(num_running=1))],
        routing={"c0": make_routing(longest_prefix=4, blocks=8), "c1": make_routing()},
    )
    metrics.set_other_models([("coder", "c0", make_stats(num_running=1))], [("coder", coder)])
    scraped = samples(metrics)
    of_coder = {"model_name": "coder"}
    assert (value(scraped, "replicas_asked", **of_coder), value(scraped, "replicas_ready", **of_coder)) == (
        2,
        2,
    )
    assert value(scraped, "replicas_ready") == 1  # the default model's set, as before
    up = {
        (dict(labels)["model_name"], dict(labels)["replica"]): v
        for (name, labels), v in scraped.items()
        if name == "pagedchat:replica_up"
    }
    assert up == {("tiny", "r0"): 1, ("tiny", "r1"): 0, ("coder", "c0"): 1, ("coder", "c1"): 1}
    assert value(scraped, "routed_requests_total", **of_coder, replica="c0", outcome="longest_prefix") == 4
    assert value(scraped, "num_requests_running", **of_coder, replica="c0") == 1
    metrics.set_other_models([], [])  # coder unloaded: its series go with it
    assert not [key for key in samples(metrics) if ("model_name", "coder") in key[1]]


def test_speculative_decoding_is_counted_with_vllms_names_and_acceptance_by_position():
    spec = SpecStats("ngram", 40, 110, 83, (40, 25, 12, 6), 35)
    scraped = scrape(spec=spec)
    assert value(scraped, "spec_decode_num_drafts_total") == 40
    assert value(scraped, "spec_decode_num_draft_tokens_total") == 110
    assert value(scraped, "spec_decode_num_accepted_tokens_total") == 83
    per_pos = [
        value(scraped, "spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(4)
    ]
    assert per_pos == [40, 25, 12, 6]
    assert not any(name.startswith("pagedchat:spec_decode") for name, _ in scrape())  # off: no series

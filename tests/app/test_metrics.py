"""The Prometheus exposition of EngineStats: prefix hits by tier, the loading gauge and the disk tier's metrics."""

from __future__ import annotations

from dataclasses import fields

from prometheus_client.parser import text_string_to_metric_families

from app.services.metrics import TIER_COUNTERS, TIER_GAUGES, Metrics
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

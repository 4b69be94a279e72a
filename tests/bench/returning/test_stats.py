"""bench/returning/stats.py: the RAM / disk / recomputed split of a round, history reuse, and the counters' names."""

from __future__ import annotations

import math

import pytest

from bench.common.session_client import TurnResult
from bench.returning.stats import (
    DISK_AFTER_RESTART,
    DISK_FROM_COUNTERS,
    HitCounters,
    disk_split,
    hit_counters,
    parse_metrics,
    share_pct,
    summarise_run,
    summarise_turn,
)

METRICS = """\
# HELP pagedchat:prefix_cache_queries_total Prompt tokens looked up in the prefix cache.
# TYPE pagedchat:prefix_cache_queries_total counter
pagedchat:prefix_cache_queries_total{model_name="m"} 1000.0
pagedchat:prefix_cache_hits_total{model_name="m"} 600.0
pagedchat:prefix_cache_hits_by_tier_total{model_name="m",tier="ram"} 472.0
pagedchat:prefix_cache_hits_by_tier_total{model_name="m",tier="disk"} 128.0
pagedchat:kv_cache_info{kv_cache_dtype="bfloat16",model_name="m"} 1.0
pagedchat:kv_cache_bytes_per_token{model_name="m"} 23040.0
"""


def make_result(prompt: int, cached: int, completion: int = 10, ttft_s: float = 0.1, ok: bool = True):
    return TurnResult(
        ok=ok,
        ttft_s=ttft_s,
        e2e_s=1.0,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
    )


def test_parse_metrics_keys_samples_by_name_and_labels_but_the_model_name():
    assert parse_metrics(METRICS) == {
        "pagedchat:prefix_cache_queries_total": 1000.0,
        "pagedchat:prefix_cache_hits_total": 600.0,
        'pagedchat:prefix_cache_hits_by_tier_total{tier="ram"}': 472.0,
        'pagedchat:prefix_cache_hits_by_tier_total{tier="disk"}': 128.0,
        'pagedchat:kv_cache_info{kv_cache_dtype="bfloat16"}': 1.0,
        "pagedchat:kv_cache_bytes_per_token": 23040.0,
    }


def test_hit_counters_from_the_admin_stats():
    admin = {"prefix_query_tokens": 1000, "prefix_hit_tokens": 600, "disk_hit_tokens": 256, "num_blocks": 9}
    assert hit_counters(admin, None) == HitCounters(1000, 600, 256)
    # a server whose admin stats do not name the disk: hits known, the split not
    assert hit_counters({"prefix_query_tokens": 1000, "prefix_hit_tokens": 600}, None) == HitCounters(
        1000, 600, None
    )


def test_hit_counters_from_the_metrics():
    metrics = parse_metrics(METRICS)
    assert hit_counters(None, metrics) == HitCounters(1000, 600, 128)
    without_tiers = {k: v for k, v in metrics.items() if "by_tier" not in k}
    assert hit_counters(None, without_tiers) == HitCounters(1000, 600, None)
    assert hit_counters(None, {"pagedchat:kv_cache_bytes_per_token": 512.0}) is None
    assert hit_counters(None, None) is None


def test_counters_minus_an_earlier_reading():
    assert HitCounters(1000, 600, 256).minus(HitCounters(400, 100, 56)) == HitCounters(600, 500, 200)
    assert HitCounters(1000, 600, None).minus(HitCounters(400, 100, None)) == HitCounters(600, 500, None)


def test_disk_split_prefers_the_counters_then_the_restart():
    assert disk_split(HitCounters(600, 500, 200), 480, after_restart=True) == (200, DISK_FROM_COUNTERS)
    assert disk_split(HitCounters(600, 500, None), 480, after_restart=True) == (480, DISK_AFTER_RESTART)
    assert disk_split(None, 480, after_restart=True) == (480, DISK_AFTER_RESTART)
    assert disk_split(HitCounters(600, 500, None), 480, after_restart=False) == (None, None)


def test_share_pct_splits_prompt_tokens_three_ways():
    assert share_pct(1000, 800, 600) == {"ram": 20.0, "disk": 60.0, "recomputed": 20.0}
    unknown = share_pct(1000, 800, None)
    assert math.isnan(unknown["ram"]) and math.isnan(unknown["disk"]) and unknown["recomputed"] == 20.0
    assert all(math.isnan(v) for v in share_pct(0, 0, 0).values())


def test_summarise_turn_reuse_is_of_each_conversations_previous_prompt_and_answer():
    previous = [make_result(300, 0, completion=20), make_result(180, 0, completion=20)]
    results = [make_result(500, 304, ttft_s=0.2), make_result(400, 192, ttft_s=0.4)]
    turn = summarise_turn(2, results, previous, HitCounters(900, 496, 304))
    assert turn["turn"] == 2 and turn["num_ok"] == 2 and not turn["after_restart"]
    assert (turn["prompt_tokens"], turn["cached_tokens"], turn["disk_tokens"]) == (900, 496, 304)
    assert turn["disk_split_source"] == DISK_FROM_COUNTERS
    assert turn["share_pct"] == pytest.approx(
        {"ram": 100 * 192 / 900, "disk": 100 * 304 / 900, "recomputed": 100 * 404 / 900}
    )
    assert turn["history_tokens"] == 320 + 200 and turn["history_cached_tokens"] == 496
    assert turn["history_reused_pct"] == pytest.approx(100 * 496 / 520)
    assert turn["history_reused_min_pct"] == pytest.approx(95.0)  # 304 of 320 (the other: 192 of 200)
    assert turn["ttft_ms"]["p50"] == pytest.approx(300.0) and turn["ttft_ms"]["p99"] == pytest.approx(398.0)
    assert turn["mean_prompt_tokens"] == 450.0


def test_summarise_turn_leaves_failed_turns_out_and_the_first_turn_has_no_history():
    first = summarise_turn(1, [make_result(200, 0), make_result(0, 0, ok=False)], None, None)
    assert (first["num_ok"], first["prompt_tokens"], first["history_tokens"]) == (1, 200, 0)
    assert math.isnan(first["history_reused_pct"]) and math.isnan(first["history_reused_min_pct"])
    assert first["disk_tokens"] is None and first["share_pct"]["recomputed"] == 100.0
    # a reply that ended at its first token streamed no text: its time to first token is its whole time
    no_text = TurnResult(ok=True, e2e_s=0.25, prompt_tokens=10)
    assert summarise_turn(1, [no_text], None, None)["ttft_ms"]["p50"] == 250.0
    # a conversation whose previous turn failed is not counted as returning
    later = summarise_turn(
        2,
        [make_result(400, 100), make_result(400, 300)],
        [make_result(0, 0, ok=False), make_result(300, 0)],
        None,
    )
    assert later["history_tokens"] == 310 and later["history_cached_tokens"] == 300


def test_summarise_run_pools_history_over_the_returning_turns():
    previous = [make_result(300, 0, completion=20)]
    turns = [
        summarise_turn(1, previous, None, None),
        summarise_turn(2, [make_result(500, 160)], previous, None),
    ]
    run = summarise_run(turns, [previous, [make_result(500, 160)], [TurnResult(ok=False, error="boom")]])
    assert run["turns"] == turns
    assert run["returning_history_reused_pct"] == 50.0  # 160 of 320
    assert (run["num_turns_failed"], run["errors"]) == (1, ["boom"])

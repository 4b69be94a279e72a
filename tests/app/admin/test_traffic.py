"""The traffic recorder behind the admin charts and advice: rates, waste, the rolling window, ended sequences."""

from __future__ import annotations

import pytest

from app.admin.traffic import TrafficRecorder
from tests.app.stats_factories import make_stats


def test_first_point_has_no_rates():
    point = TrafficRecorder().observe_stats(make_stats(num_used_blocks=3, num_free_blocks=61), now=100.0)
    assert (point.num_used_blocks, point.num_free_blocks, point.preemptions_per_min) == (3, 61, 0.0)
    assert (point.tokens_per_s, point.prefix_hit_rate) == (0.0, None)
    assert (point.ram_hit_rate, point.disk_hit_rate) == (None, None)


def test_rates_waste_and_json():
    rec = TrafficRecorder()
    rec.observe_stats(
        make_stats(prefix_query_tokens=100, prefix_hit_tokens=10, num_generation_tokens_total=50), 0.0
    )
    rec.observe_stats(make_stats(num_generation_tokens_total=150, num_preemptions=1), 29.0)
    point = rec.observe_stats(
        make_stats(
            num_running=2,
            num_tokens_stored=40,
            num_slots_allocated=64,
            num_preemptions=3,
            prefix_query_tokens=300,
            prefix_hit_tokens=160,
            num_generation_tokens_total=250,
        ),
        30.0,
        num_preempted=1,
    )
    assert point.preemptions_per_min == 6.0  # 3 in the 30 s since the oldest sample of the last minute
    assert point.prefix_hit_rate == 0.75  # (160 - 10) / (300 - 100)
    assert point.tokens_per_s == 100.0  # 100 tokens in the 1 s since the sample at 29 s
    assert (point.paged_waste_tokens, point.contiguous_waste_tokens) == (24, 2 * 512 - 40)
    assert point.to_json()["num_preempted"] == 1
    assert (rec.preemptions_in_window(), rec.peak_running(), rec.observed_span_s(30.0)) == (3, 2, 30.0)


def test_hit_rate_splits_into_ram_and_disk_over_the_last_minute():
    rec = TrafficRecorder()
    rec.observe_stats(make_stats(prefix_query_tokens=1000, prefix_hit_tokens=500, disk_hit_tokens=100), 0.0)
    rec.observe_stats(make_stats(prefix_query_tokens=1100, prefix_hit_tokens=550, disk_hit_tokens=100), 30.0)
    point = rec.observe_stats(
        make_stats(prefix_query_tokens=1400, prefix_hit_tokens=840, disk_hit_tokens=260), 70.0
    )
    # since the sample at 30 s (the one at 0 s is over a minute old): 300 queried, 290 hit, 160 of them from disk
    assert (point.prefix_hit_rate, point.ram_hit_rate, point.disk_hit_rate) == (
        290 / 300,
        130 / 300,
        160 / 300,
    )
    assert (point.to_json()["ram_hit_rate"], point.to_json()["disk_hit_rate"]) == (0.4333, 0.5333)


def test_window_drops_old_samples_points_and_lengths():
    rec = TrafficRecorder(window_s=60.0)
    rec.observe_sequence(100, now=0.0)
    rec.observe_stats(make_stats(num_preemptions=5, num_running=7), 0.0)
    rec.observe_sequence(200, now=50.0)
    rec.observe_stats(make_stats(num_preemptions=6), 50.0)
    rec.observe_stats(make_stats(num_preemptions=8), 70.0)
    assert rec.sequence_lengths() == [200]
    assert [p.time_s for p in rec.points()] == [50.0, 70.0]
    assert [p.time_s for p in rec.points(since_s=60.0)] == [70.0]
    assert (rec.preemptions_in_window(), rec.peak_running(), rec.observed_span_s(70.0)) == (2, 0, 20.0)


def test_live_sequence_diff_records_the_ones_that_ended():
    rec = TrafficRecorder()
    assert (
        rec.observe_live_sequences([{"seq_id": 1, "num_tokens": 10}, {"seq_id": 2, "num_tokens": 5}], 1.0)
        == []
    )
    assert rec.observe_live_sequences(
        [{"seq_id": 2, "num_tokens": 9}, {"seq_id": 3, "num_tokens": 4}], 2.0
    ) == [10]
    assert rec.observe_live_sequences([], 3.0) == [9, 4]
    assert rec.sequence_lengths() == [10, 9, 4]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="window_s must be at least 60"):
        TrafficRecorder(window_s=10.0)
    rec = TrafficRecorder()
    rec.observe_stats(make_stats(), 5.0)
    with pytest.raises(ValueError, match="time order"):
        rec.observe_stats(make_stats(), 4.0)
    with pytest.raises(ValueError, match="non-negative"):
        rec.observe_sequence(-1, 5.0)
    assert len(rec.points()) == 1 and rec.sequence_lengths() == []  # refused input left no trace


def test_generation_speed_drops_to_zero_as_soon_as_the_engine_idles():
    rec = TrafficRecorder()
    rec.observe_stats(make_stats(num_running=1, num_generation_tokens_total=0), 10.0)
    busy = rec.observe_stats(make_stats(num_running=1, num_generation_tokens_total=20), 10.5)
    ended = rec.observe_stats(
        make_stats(num_generation_tokens_total=23), 11.0
    )  # the last 3 tokens, then done
    idle = rec.observe_stats(
        make_stats(num_generation_tokens_total=23), 11.5
    )  # the 2 s window still holds 23
    later = rec.observe_stats(make_stats(num_generation_tokens_total=23), 20.0)
    assert [p.tokens_per_s for p in (busy, ended, idle, later)] == [40.0, 23.0, 0.0, 0.0]
    assert rec.peak_used_blocks() == 0


def test_peak_used_blocks_over_the_window():
    rec = TrafficRecorder(window_s=60.0)
    rec.observe_stats(make_stats(num_used_blocks=40, num_free_blocks=24), 0.0)
    rec.observe_stats(make_stats(num_used_blocks=9, num_free_blocks=55), 30.0)
    assert rec.peak_used_blocks() == 40
    rec.observe_stats(make_stats(num_used_blocks=2, num_free_blocks=62), 70.0)  # the 40 left the window
    assert rec.peak_used_blocks() == 9


def test_a_point_after_sampling_resumed_is_marked_so_charts_do_not_join_it():
    rec = TrafficRecorder()
    first = rec.observe_stats(make_stats(), 0.0, resumed=True)  # nothing before it to join: not a gap
    rec.observe_stats(make_stats(), 0.5)
    late = rec.observe_stats(make_stats(num_running=1), 9.0)  # late behind a long engine step: the same line
    again = rec.observe_stats(make_stats(), 300.0, resumed=True)
    assert [p.resumed for p in (first, late, again)] == [False, False, True]
    assert again.to_json()["resumed"] is True

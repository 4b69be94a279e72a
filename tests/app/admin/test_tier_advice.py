"""The admin page's advice on the disk tier: exact words for a healthy, too small, failed or overflowing tier."""

from __future__ import annotations

from app.admin.tier_advice import tier_advice
from tests.app.stats_factories import make_tier_stats


def levels_and_titles(items) -> list[tuple[str, str]]:
    return [(item.level, item.title) for item in items]


def test_no_tier_asked_for_gives_no_advice():
    assert tier_advice(None, configured=False) == []


def test_a_tier_asked_for_but_not_opened_points_to_the_log():
    [item] = tier_advice(None, configured=True)
    assert (item.level, item.title) == ("warn", "Disk tier off")
    assert item.text == (
        "A disk tier was asked for (kv_disk_bytes is not 0) but could not be opened: serving goes on without it. "
        "The server log's 'KV disk tier off' warning says why (the directory unusable or held by another process, "
        "or the disk too full for one block)."
    )


def test_a_healthy_tier_says_what_it_holds():
    [item] = tier_advice(make_tier_stats(), configured=True)  # 2 of 40 lookups evicted: 5%, under 10%
    assert (item.level, item.title) == ("ok", "Disk tier")
    assert item.text == (
        "The disk tier holds 10 blocks (640 KiB of its 1.0 MiB cap); of 40 lookups since start, 2 stopped at a "
        "block it had evicted."
    )


def test_many_lookups_stopping_at_evicted_blocks_say_raise_the_cap():
    [item] = tier_advice(make_tier_stats(num_lookups=40, num_lookups_evicted=4), configured=True)
    assert (item.level, item.title) == ("warn", "Disk tier too small for the returning traffic")
    assert item.text == (
        "4 of 40 disk lookups since start (10%) stopped at a block the tier had held but evicted to stay within "
        "its cap of 1.0 MiB (20 blocks evicted): returning conversations found their blocks gone and recomputed "
        "them. Raise --kv-disk-bytes (e.g. to 2.0 MiB) if the disk has room."
    )


def test_a_high_share_of_few_lookups_is_not_yet_a_pattern():
    items = tier_advice(make_tier_stats(num_lookups=19, num_lookups_evicted=19), configured=True)
    assert levels_and_titles(items) == [("ok", "Disk tier")]


def test_a_tier_turned_off_after_an_error_says_so_and_points_to_the_log():
    [item] = tier_advice(make_tier_stats(enabled=False, num_write_errors=1), configured=True)
    assert (item.level, item.title) == ("warn", "Disk tier turned off after an error")
    assert item.text == (
        "The disk tier turned itself off after an error (write errors since start: 1): no block is written to or "
        "loaded from it until the server restarts. The server log's 'KV disk tier turned off' warning says why."
    )


def test_dropped_writes_say_the_queue_overflowed():
    [item] = tier_advice(
        make_tier_stats(num_write_drops=7, write_queue_depth=256, write_lag_seconds=3.4), configured=True
    )
    assert (item.level, item.title) == ("warn", "Disk tier write queue overflowed")
    assert item.text == (
        "7 blocks were not written since start because the write queue was full (30 written; 256 queued now, the "
        "oldest 3.4 s old): the disk takes blocks slower than sequences free them. A dropped block is recomputed "
        "when its conversation returns; a faster disk keeps up."
    )


def test_every_problem_is_listed():
    tier = make_tier_stats(enabled=False, num_write_errors=2, num_lookups_evicted=30, num_write_drops=1)
    assert levels_and_titles(tier_advice(tier, configured=True)) == [
        ("warn", "Disk tier turned off after an error"),
        ("warn", "Disk tier too small for the returning traffic"),
        ("warn", "Disk tier write queue overflowed"),
    ]

"""The admin page's advice: exact figures and words for idle, undersized, long-tail and bursty traffic."""

from __future__ import annotations

import json

import pytest

from app.admin.advice import Advice, AdviceInputs, advise, format_bytes, percentile


def make_inputs(**overrides) -> AdviceInputs:
    """A 256-block pool of 16-token blocks (8 KiB each), max_model_len 1024, 2 minutes observed, 2 running."""
    values = dict(
        block_size=16,
        num_blocks=256,
        block_bytes=8192,
        max_model_len=1024,
        max_num_seqs=8,
        num_running=2,
        num_tokens_stored=300,
        num_slots_allocated=320,
        window_s=120.0,
        num_preemptions=0,
        peak_running=3,
        sequence_lengths=[],
    )
    values.update(overrides)
    return AdviceInputs(**values)


def titles(advice: Advice) -> list[tuple[str, str]]:
    return [(item.level, item.title) for item in advice.items]


def test_percentile_is_nearest_rank():
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile(list(range(1, 11)), 99) == 10
    assert percentile([7], 1) == 7
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(2 * 1024**2) == "2.0 MiB"
    assert format_bytes(300 * 1024**2) == "300 MiB"
    assert format_bytes(5 * 1024**4) == "5120 GiB"


def test_quiet_pool_reports_capacity_and_what_paging_saves_apart_from_the_advice():
    advice = advise(make_inputs())
    assert titles(advice) == [
        ("info", "Pool capacity"),
        ("info", "Sequence lengths"),
        ("ok", "No preemption"),
    ]
    assert advice.items[0].text == (
        "256 blocks of 16 tokens hold 4096 tokens (2.0 MiB): 4 sequences of max_model_len (1024) at once; "
        "up to 8 may run (max_num_seqs)."
    )
    assert advice.items[1].text == (
        "No sequence has ended yet in the window; p50 and p99 of sequence lengths appear once requests finish."
    )
    assert advice.items[2].text == (
        "No sequence was preempted in the last 2 min: the pool is large enough for this concurrency."
    )
    assert (advice.paging.title, advice.paging.text) == (
        "What paging saves",
        "Now: 2 running sequences store 300 tokens in 320 paged slots (waste 20). A hypothetical engine reserving "
        "max_model_len (1024) per sequence, as a contiguous KV cache does, would hold 2048 slots (1.0 MiB, waste "
        "1748). At the peak of 3 running it would have needed 3072 tokens, 75% of this pool.",
    )
    assert (advice.p50, advice.p99, advice.p99_sequences_fit, advice.suggested_max_model_len) == (
        None,
        None,
        None,
        None,
    )
    assert (
        advice.max_len_sequences_fit,
        advice.contiguous_reserved_tokens,
        advice.paged_allocated_tokens,
    ) == (
        4,
        2048,
        320,
    )
    assert advice.preemptions_per_min == 0.0


def test_sustained_preemption_in_a_small_pool_says_lower_concurrency_or_grow_the_pool():
    # 64 blocks; a 200-token sequence needs 13 blocks, so 4 fit while 8 may run
    advice = advise(
        make_inputs(num_blocks=64, num_preemptions=6, peak_running=8, sequence_lengths=[200] * 50)
    )
    assert titles(advice)[2] == ("warn", "Sustained preemption")
    assert advice.items[2].text == (
        "3.0 preemptions per minute over the last 2 min: the pool is too small for the concurrency (up to 8 "
        "sequences ran at once). At the p99 length (200 tokens) the pool holds 4 sequences but up to 8 may run: "
        "lower max_num_seqs to 4, or raise the KV budget by 40 blocks (320 KiB) to 104 blocks."
    )
    assert advice.items[1].text == (
        "50 sequences ended in the last 2 min: p50 200 tokens, p99 200 tokens, beside a max_model_len of 1024 "
        "(p99 is 20% of it)."
    )
    assert (advice.p50, advice.p99, advice.p99_sequences_fit, advice.preemptions_per_min) == (
        200,
        200,
        4,
        3.0,
    )
    assert advice.suggested_max_model_len is None  # fewer than 100 sequences: no tail to cut off


def test_a_preempting_float_pool_is_told_what_int8_kv_would_hold():
    inputs = dict(num_blocks=64, num_preemptions=6, peak_running=8, sequence_lengths=[200] * 50)
    advice = advise(make_inputs(**inputs, kv_cache_dtype="bfloat16", int8_block_bytes=4224))  # 8192 / 4224
    assert advice.items[2].text.endswith(
        " An int8 KV cache (--kv-cache-dtype int8) holds 1.94x the tokens in the same bytes (124 blocks instead of "
        "64); `pagedchat bench quality` shows what it costs in logits."
    )
    assert advice.items[0].text.startswith("64 blocks of 16 tokens hold 1024 tokens of bfloat16 KV (512 KiB)")
    already = advise(make_inputs(**inputs, kv_cache_dtype="int8", int8_block_bytes=None))
    assert "int8 KV cache" not in already.items[2].text and "tokens of int8 KV" in already.items[0].text


def test_rare_long_requests_get_a_max_model_len_suggestion_from_the_p99():
    lengths = [100] * 95 + [200] * 4 + [1000]
    advice = advise(make_inputs(num_preemptions=10, peak_running=8, sequence_lengths=lengths))
    assert titles(advice) == [
        ("info", "Pool capacity"),
        ("info", "Sequence lengths"),
        ("warn", "Sustained preemption"),
        ("warn", "Rare long requests drive the preemption"),
    ]
    assert advice.items[2].text.endswith(
        "The pool holds 19 sequences of the p99 length (200 tokens), at least max_num_seqs (8): the sequences "
        "longer than the p99 are the ones crowding it out."
    )
    assert advice.items[3].text == (
        "99% of sequences end within 200 tokens, yet max_model_len is 1024 and the longest reached 1000. A "
        "max_model_len of 208 (the p99, rounded up to a block) would refuse the longest 1% with a clear error "
        "instead of letting them evict everyone else; the pool holds 19 sequences of that length."
    )
    assert advice.paging.text.endswith(
        "At the peak of 8 running it would have needed 8192 tokens, 200% of this pool, where the median sequence "
        "used 10% of its reservation."
    )
    assert (advice.p50, advice.p99, advice.suggested_max_model_len, advice.preemptions_per_min) == (
        100,
        200,
        208,
        5.0,
    )


def test_a_short_burst_of_preemption_is_not_sustained():
    advice = advise(make_inputs(window_s=30.0, num_preemptions=5))
    assert titles(advice)[2] == ("info", "Occasional preemption")
    assert (
        advice.items[2].text
        == "5 preemptions in the last 30 s (10.0 per minute): a burst, not yet a pattern."
    )
    slow = advise(make_inputs(window_s=600.0, num_preemptions=5))  # 0.5 per minute over 10 minutes
    assert titles(slow)[2] == ("info", "Occasional preemption")


def test_no_observation_window_means_no_rate():
    advice = advise(
        make_inputs(
            window_s=0.0,
            num_preemptions=3,
            num_running=0,
            num_tokens_stored=0,
            num_slots_allocated=0,
            peak_running=0,
        )
    )
    assert advice.preemptions_per_min == 0.0
    assert advice.paging.text == (
        "Now: 0 running sequences store 0 tokens in 0 paged slots (waste 0). A hypothetical engine reserving "
        "max_model_len (1024) per sequence, as a contiguous KV cache does, would hold 0 slots (0 B, waste 0)."
    )


def test_advice_is_json_ready():
    data = json.loads(json.dumps(advise(make_inputs(sequence_lengths=[10, 20, 30])).to_json()))
    assert (data["p50"], data["p99"], data["p99_sequences_fit"]) == (20, 30, 128)
    assert data["items"][0] == {
        "level": "info",
        "title": "Pool capacity",
        "text": "256 blocks of 16 tokens hold 4096 tokens (2.0 MiB): 4 sequences of max_model_len (1024) at once, "
        "or 128 of the observed p99 length (30 tokens); up to 8 may run (max_num_seqs).",
    }


@pytest.mark.parametrize(
    ("used", "guard", "expected"),
    [
        (
            512 * 1024**2,
            2 * 1024**3,
            (
                "ok",
                "Database size",
                "The database uses 512 MiB, 25% of its guard of 2.0 GiB (max_database_bytes).",
            ),
        ),
        (
            1800 * 1024**2,
            2 * 1024**3,
            (
                "warn",
                "Database nears its size guard",
                "The database uses 1.8 GiB, 88% of its guard of 2.0 GiB (max_database_bytes); at the guard new "
                "sessions and messages are refused with 507. Raise max_database_bytes, or lower the per-owner "
                "quotas and delete old sessions.",
            ),
        ),
        (
            8192,
            4096,
            (
                "warn",
                "Database full",
                "The database uses 8.0 KiB, 200% of its guard of 4.0 KiB (max_database_bytes): new sessions and "
                "messages are refused with 507. Raise max_database_bytes, or lower the per-owner quotas and delete "
                "old sessions (their pages are reused).",
            ),
        ),
        (
            3 * 1024**2,
            0,
            ("info", "Database size", "The database uses 3.0 MiB; no size guard (max_database_bytes 0)."),
        ),
    ],
)
def test_the_database_size_against_its_guard(used, guard, expected):
    advice = advise(make_inputs(database_bytes=used, max_database_bytes=guard))
    item = advice.items[-1]
    assert (item.level, item.title, item.text) == expected
    assert titles(advise(make_inputs()))[-1] == ("ok", "No preemption")  # size unknown: no item


def test_an_oversized_pool_is_told_the_kv_cache_bytes_its_traffic_needs():
    # the default CPU pool: 2 GiB of SmolLM2's 368,640-byte blocks, at most 23 blocks in use over 10 minutes
    inputs = dict(
        num_blocks=5825, block_bytes=368640, max_model_len=8192, window_s=600.0, peak_used_blocks=23
    )
    advice = advise(make_inputs(**inputs))
    [item] = [i for i in advice.items if i.title == "Pool larger than the traffic needs"]
    # 2 x 23 = 46 blocks, but one max_model_len sequence takes 512: 512 blocks are 180 MiB
    assert (item.level, advice.suggested_kv_cache_bytes) == ("info", 180 * 1024**2)
    assert item.text == (
        "The 2.0 GiB pool (5825 blocks) was at most 0.4% in use (23 blocks) over the last 10 min: --kv-cache-bytes "
        "188743680 (180 MiB, 512 blocks: 2x that peak, and room for a max_model_len sequence) would do and free "
        "1.8 GiB. A smaller pool keeps fewer finished prompts cached for reuse (5802 blocks may hold them now)."
    )
    busier = advise(make_inputs(**{**inputs, "max_model_len": 2048, "peak_used_blocks": 400}))
    assert busier.suggested_kv_cache_bytes == 282 * 1024**2  # 800 blocks are 281.25 MiB, rounded up
    assert "at most 6.9% in use (400 blocks)" in busier.items[-1].text


@pytest.mark.parametrize(
    "overrides",
    [
        dict(window_s=60.0),  # too little traffic seen to call it oversized
        dict(peak_used_blocks=0),  # no traffic at all in the window
        dict(peak_used_blocks=600),  # over 10% of the pool in use at the peak
        dict(max_model_len=65536),  # a max_model_len sequence alone needs over half the pool
    ],
)
def test_no_smaller_pool_without_evidence_or_room(overrides):
    inputs = dict(
        num_blocks=5825, block_bytes=368640, max_model_len=8192, window_s=600.0, peak_used_blocks=23
    )
    advice = advise(make_inputs(**{**inputs, **overrides}))
    assert advice.suggested_kv_cache_bytes is None
    assert "Pool larger than the traffic needs" not in [title for _, title in titles(advice)]

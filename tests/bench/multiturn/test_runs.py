"""bench/multiturn/runs.py: a run's per-turn summary and its cache hit rate over all turns."""

from __future__ import annotations

import pytest

from bench.common.session_client import TurnResult
from bench.multiturn.runs import summarise


def test_multiturn_summary_counts_cache_hits_over_all_turns():
    def turn(ttft: float, prompt: int, cached: int) -> TurnResult:
        return TurnResult(ok=True, ttft_s=ttft, e2e_s=1.0, prompt_tokens=prompt, cached_tokens=cached)

    users = [[turn(0.1, 100, 96), turn(0.1, 200, 192)], [turn(0.3, 100, 80), turn(0.3, 220, 208)]]
    s = summarise(
        users,
        2,
        {"prefix_query_tokens": 10, "prefix_hit_tokens": 5},
        {"prefix_query_tokens": 110, "prefix_hit_tokens": 85},
    )
    assert (s["prompt_tokens"], s["cached_tokens"], s["prefill_tokens"]) == (620, 576, 44)
    assert s["cache_hit_pct"] == pytest.approx(100 * 576 / 620)
    assert s["turns"][0]["mean_prefill_tokens"] == 12.0 and s["turns"][1]["mean_prefill_tokens"] == 10.0
    assert s["ttft_ratio_last_first"] == pytest.approx(1.0)
    assert s["server_prefix_hit_pct"] == 80.0

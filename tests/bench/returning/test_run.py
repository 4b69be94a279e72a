"""`bench multiturn --scenario returning` end to end on the tiny model: the tier run with its restart (the other runs
share its code; their report is tested in test_returning_report.py)."""

from __future__ import annotations

import json
import shlex

from bench.cli import bench_main
from bench.returning.stats import DISK_FROM_COUNTERS
from tests.engine.bench_helpers import shared_tiny_model

BYTES_PER_TOKEN = 512  # the tiny model in float32: 2 layers x K and V x 2 KV heads x 16 dims x 4 bytes
POOL_TOKENS = 768


def test_the_tier_run_reuses_histories_from_disk_after_its_restart(tmp_path, capsys):
    model = shared_tiny_model()
    argv = shlex.split(
        f"multiturn --scenario returning --runs tier --model {model} --dtype float32 --users 2 --turns 3 "
        f"--history-tokens 600 --system-tokens 160 --max-tokens 4 --kv-cache-bytes {POOL_TOKENS * BYTES_PER_TOKEN} "
        f"--results-dir {tmp_path / 'results'} --keep-logs {tmp_path / 'logs'}"
    )
    assert bench_main(argv) == 0
    [path] = (tmp_path / "results").glob("multiturn-returning-*.json")
    assert path.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads(path.read_text())

    assert doc["scenario"] == "returning"
    workload = doc["workload"]
    assert (workload["num_users"], workload["num_turns"], workload["restart_after"]) == (2, 3, 1)
    assert workload["runs"] == ["tier"] and workload["kv_bytes_per_token"] == BYTES_PER_TOKEN
    [(name, run)] = doc["runs"].items()
    assert name == "tier" and run["pool_tokens"] == POOL_TOKENS
    assert run["num_turns_failed"] == 0, run["errors"]
    assert run["restart_turn"] == 2
    turns = run["turns"]
    assert [(t["turn"], t["after_restart"], t["num_ok"]) for t in turns] == [
        (1, False, 2),
        (2, True, 2),
        (3, False, 2),
    ]
    for t in turns:
        assert set(t["share_pct"]) == {"ram", "disk", "recomputed"}
        assert t["ttft_ms"]["p50"] > 0 and t["ttft_ms"]["p99"] >= t["ttft_ms"]["p50"]
        assert t["cold_tier_files"]["num_files"] >= 0
    # turn 1: nothing to reuse; each conversation's history grows every turn
    assert turns[0]["cached_tokens"] == 0 and turns[0]["history_tokens"] == 0
    assert turns[0]["share_pct"]["recomputed"] == 100.0
    assert turns[0]["mean_prompt_tokens"] < turns[1]["mean_prompt_tokens"] < turns[2]["mean_prompt_tokens"]
    # the first turn after the restart: a new process, so every reused token was read from the disk tier, whose
    # files were made cold before the round
    restart = turns[1]
    assert restart["cold_tier_files"]["num_files"] > 0
    assert restart["disk_tokens"] > 0 and restart["disk_tokens"] == restart["cached_tokens"]
    assert restart["share_pct"]["ram"] == 0.0 and restart["share_pct"]["disk"] > 0
    assert [t["disk_split_source"] for t in turns] == [DISK_FROM_COUNTERS] * 3  # the admin API's counters
    assert run["tier_stats"]["num_loaded_blocks"] * 16 >= restart["disk_tokens"]
    assert restart["history_reused_min_pct"] > 50
    assert run["returning_history_reused_pct"] > 50
    # without an in-RAM or no-tier run, only the tier's own targets
    assert [t["name"] for t in doc["targets"]] == [
        "tier: returning users' history tokens served from RAM or disk %",
        "tier: turn 2, after the restart: history reused by the least conversation %",
    ]
    assert doc["ttft_ratios"] == [{"turn": 2}, {"turn": 3}]
    out = capsys.readouterr().out
    assert "2 (restart)" in out and "pools in tokens: tier 768" in out

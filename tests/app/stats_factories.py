"""EngineStats and TierStats built directly, for the metrics, traffic and advice tests."""

from __future__ import annotations

from typing import Any

from engine.core.stats import EngineStats
from engine.core.tier import TierStats


def make_stats(**overrides: Any) -> EngineStats:
    """An idle 64-block pool of 16-token blocks, max_model_len 512, no disk tier."""
    values: dict[str, Any] = dict(
        num_running=0,
        num_waiting=0,
        num_preemptions=0,
        num_blocks=64,
        num_free_blocks=64,
        num_cached_blocks=0,
        num_used_blocks=0,
        num_shared_blocks=0,
        num_tokens_stored=0,
        num_slots_allocated=0,
        prefix_query_tokens=0,
        prefix_hit_tokens=0,
        num_prompt_tokens_total=0,
        num_generation_tokens_total=0,
        num_steps=0,
        block_size=16,
        max_model_len=512,
    )
    values.update(overrides)
    return EngineStats(**values)


def make_tier_stats(**overrides: Any) -> TierStats:
    """An enabled 1 MiB tier holding 10 blocks of 64 KiB, with some traffic behind it."""
    values: dict[str, Any] = dict(
        enabled=True,
        capacity_bytes=1024**2,
        used_bytes=10 * 65536,
        num_blocks=10,
        num_files=12,
        num_writes=30,
        num_write_drops=0,
        num_write_errors=0,
        write_queue_depth=2,
        write_lag_seconds=0.25,
        num_loads=4,
        num_loaded_blocks=10,
        num_load_failures=1,
        load_seconds_total=0.5,
        num_evictions=20,
        num_lookups=40,
        num_lookups_evicted=2,
    )
    values.update(overrides)
    return TierStats(**values)

"""The disk tier through a real app: /metrics, /api/admin/state and the admin feed report it, and a prompt whose
blocks left the RAM pool comes back as disk hits."""

from __future__ import annotations

import pytest

from tests.app.factories import (
    TINY_BLOCK_BYTES,
    make_client,
    metric,
    pool_is_idle,
    pool_state,
    wait_pool_idle,
)

TIER_BYTES = 1024**2
NUM_POOL_BLOCKS = 24


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("tier"),
        kv_disk_bytes=TIER_BYTES,
        kv_cache_bytes=NUM_POOL_BLOCKS * 16 * TINY_BLOCK_BYTES,
        max_model_len=256,
    ) as c:
        yield c


def tier_is_idle(state: dict) -> bool:
    """The pool idle and every block the tier was offered on disk."""
    return pool_is_idle(state) and state["stats"]["tier"]["write_queue_depth"] == 0


def complete(client, prompt: list[int]) -> dict:
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_prompt_evicted_from_ram_comes_back_from_disk(client):
    fresh = pool_state(client)["stats"]
    assert fresh["tier"]["capacity_bytes"] == TIER_BYTES and fresh["tier"]["enabled"] is True
    returning = list(range(1000, 1100))  # 100 tokens: 6 full blocks are cacheable
    complete(client, returning)
    for start in (2000, 3000, 4000):  # 3 x 13 blocks through a 24-block pool: the first prompt's blocks go
        complete(client, list(range(start, start + 200)))
    again = complete(client, returning)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    stats = wait_pool_idle(client, idle=tier_is_idle)["stats"]
    assert (stats["prefix_hit_tokens"], stats["disk_hit_tokens"], stats["ram_hit_tokens"]) == (96, 96, 0)
    tier = stats["tier"]
    assert (tier["num_loads"], tier["num_loaded_blocks"], tier["num_load_failures"]) == (1, 6, 0)
    text = client.get("/metrics").text
    assert metric(text, "pagedchat:prefix_cache_hits_total") == 96
    assert metric(text, "pagedchat:prefix_cache_hits_by_tier_total", tier="disk") == 96
    assert metric(text, "pagedchat:prefix_cache_hits_by_tier_total", tier="ram") == 0
    assert metric(text, "pagedchat:num_requests_loading") == 0
    assert metric(text, "pagedchat:kv_disk_enabled") == 1
    assert metric(text, "pagedchat:kv_disk_capacity_bytes") == TIER_BYTES
    assert metric(text, "pagedchat:kv_disk_loads_total") == 1
    assert metric(text, "pagedchat:kv_disk_loaded_blocks_total") == 6
    assert metric(text, "pagedchat:kv_disk_blocks") == tier["num_blocks"] > 0
    assert metric(text, "pagedchat:kv_disk_used_bytes") == tier["used_bytes"] > 0

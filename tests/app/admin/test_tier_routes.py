"""The disk tier through a real app: /metrics, /api/admin/state and the admin feed report it, and a prompt whose
blocks left the RAM pool comes back as disk hits."""

from __future__ import annotations

import json

import pytest

from app.admin.feed import admin_feed
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
def tier_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tier")


@pytest.fixture(scope="module")
def client(tier_root):
    with make_client(
        tier_root,
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


def test_the_admin_feed_has_a_tier_panel_and_advice(client, tier_root):
    feed = admin_feed(client.app)
    client.portal.call(feed.sample)  # the rates of the next point start here
    complete(client, list(range(5000, 5040)))
    wait_pool_idle(client, idle=tier_is_idle)
    state, _ = client.portal.call(feed.sample)
    json.dumps(state)  # what the SSE sends
    panel = state["tier"]
    tier = state["pool"]["stats"]["tier"]
    assert (panel["status"], panel["directory"]) == ("on", str(tier_root / "cache" / "kv"))
    assert {k: panel[k] for k in tier} == tier
    loads = tier["num_loads"]
    assert panel["mean_load_seconds"] == (tier["load_seconds_total"] / loads if loads else None)
    assert panel["blocks_per_load"] == (tier["num_loaded_blocks"] / loads if loads else None)
    [item] = [i for i in state["advice"]["items"] if i["title"].startswith("Disk tier")]
    assert (item["level"], item["title"]) == ("ok", "Disk tier")
    assert item["text"].startswith(f"The disk tier holds {tier['num_blocks']} blocks (")
    point = state["point"]  # a new 40-token prompt since the last sample: looked up, no hit anywhere
    assert (point["prefix_hit_rate"], point["ram_hit_rate"], point["disk_hit_rate"]) == (0.0, 0.0, 0.0)


def test_the_settings_rows_show_the_cap_and_directory(client, tier_root):
    page = client.get("/admin")
    assert page.status_code == 200
    assert '<th scope="row">KV disk tier</th><td>1.0 MiB cap</td>' in page.text
    assert f'<th scope="row">KV disk directory</th><td>{tier_root / "cache" / "kv"}</td>' in page.text
    assert 'id="tier-fields"' in page.text

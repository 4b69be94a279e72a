"""/health, /metrics, /api/admin/state, security headers, API keys, admin token and the waiting-queue limit."""

from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest
from starlette.testclient import TestClient

from engine.core.tier import TierStats
from tests.app.factories import (
    TINY_BLOCK_BYTES,
    make_client,
    make_tiny_model_dir,
    metric,
    pool_state,
    sse_events,
    wait_pool_idle,
)

MODEL = make_tiny_model_dir().name
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("ops")) as c:
        yield c


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    """API keys, an admin token, and room for exactly one request at a time."""
    with make_client(
        tmp_path_factory.mktemp("locked"),
        api_keys=("sk-alpha", "sk-beta"),
        admin_token="adm-token-0123456789",
        max_num_seqs=1,
        max_queued_requests=0,
    ) as c:
        yield c


def test_health_is_ok_after_warm_up(client):
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "model": MODEL, "database": "ok"}


def test_metrics_have_vllm_style_names_and_count_requests(client):
    before = client.get("/metrics").text
    done_before = metric(before, "pagedchat:request_success_total", 0.0, finished_reason="length")
    client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 5, "temperature": 0})
    text = client.get("/metrics").text
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")
    assert metric(text, "pagedchat:request_success_total", finished_reason="length") == done_before + 1
    assert metric(text, "pagedchat:kv_cache_blocks_total", model_name=MODEL) == 256
    assert metric(text, "pagedchat:kv_cache_capacity_tokens") == 256 * 16
    assert metric(text, "pagedchat:kv_cache_info", kv_cache_dtype="float32") == 1
    assert metric(text, "pagedchat:kv_cache_bytes_per_token") == TINY_BLOCK_BYTES
    assert metric(text, "pagedchat:kv_cache_usage_perc") == 0.0
    assert metric(text, "pagedchat:num_requests_running") == 0
    assert metric(text, "pagedchat:num_requests_waiting") == 0
    assert metric(text, "pagedchat:time_to_first_token_seconds_count") >= 1
    assert metric(text, "pagedchat:inter_token_latency_seconds_count") >= 4  # 4 gaps between 5 tokens
    assert metric(text, "pagedchat:generation_tokens_total") >= 5
    assert metric(text, "pagedchat:prefix_cache_queries_total") >= metric(
        text, "pagedchat:prefix_cache_hits_total"
    )
    assert metric(text, "pagedchat:num_preemptions_total") == 0
    # the memory the start-up line reports: a float model (safetensors) holds no blocks; the pool's bytes
    stats = client.get("/api/admin/state").json()["stats"]
    floats = metric(text, "pagedchat:model_weight_bytes", kind="float")
    assert (
        floats == stats["weight_bytes_float"] > 0
        and metric(text, "pagedchat:model_weight_bytes", kind="blocks") == 0
    )
    assert (
        metric(text, "pagedchat:kv_cache_pool_bytes") == stats["kv_pool_bytes"] == 256 * 16 * TINY_BLOCK_BYTES
    )
    assert metric(text, "pagedchat:memory_available_bytes") > 0 and stats["memory_available_bytes"] > 0
    page = client.get("/admin").text
    assert re.search(
        r'<th scope="row">Weights</th><td>[\d.]+ [KMG]?i?B · 0 B in blocks · [\d.]+ [KMG]iB in float</td>',
        page,
    )
    assert re.search(r'<th scope="row">Memory available</th><td>[\d.]+ [KMG]iB</td>', page)
    assert re.search(r'<th scope="row">Weights \+ KV pool</th><td>[\d.]+ [KMG]iB</td>', page)
    assert re.search(r'<th scope="row">Process memory \(RSS\)</th><td>[\d.]+ [MG]iB</td>', page)


def test_admin_state_shows_a_running_request_and_then_an_idle_pool(client):
    body = {"messages": HELLO, "max_tokens": 250, "temperature": 0, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        busy = pool_state(client)
        for _ in lines:
            pass
    assert busy["num_blocks"] == len(busy["block_states"]) == 256
    assert set(busy["block_states"]) <= {"f", "c", "u"}
    [seq] = busy["sequences"]
    assert seq["status"] == "running"
    in_use = {int(i) for i, s in enumerate(busy["block_states"]) if s == "u"}
    assert set(seq["block_table"]) == in_use
    assert {int(b) for b in busy["block_owners"]} == in_use
    assert all(busy["ref_counts"][str(b)] == 1 for b in in_use)
    assert busy["stats"]["num_used_blocks"] == len(in_use)
    assert (busy["stats"]["kv_cache_dtype"], busy["stats"]["kv_block_bytes"]) == (
        "float32",
        16 * TINY_BLOCK_BYTES,
    )
    assert busy["stats"]["tier"]["enabled"] is True  # the disk tier is on by default, its stats nested
    idle = wait_pool_idle(client)
    assert idle["stats"]["num_used_blocks"] == 0 and idle["ref_counts"] == {}
    tier = idle["stats"]["tier"]  # the tests' engines keep a disk tier in a temp directory
    assert set(tier) == {f.name for f in fields(TierStats)} and tier["enabled"] is True
    assert (
        idle["stats"]["ram_hit_tokens"]
        == idle["stats"]["prefix_hit_tokens"] - idle["stats"]["disk_hit_tokens"]
    )


def test_admin_state_is_loopback_only_without_a_token(client):
    remote = TestClient(client.app, client=("203.0.113.9", 4000))
    response = remote.get("/api/admin/state")
    assert response.status_code == 403
    assert response.json()["error"]["message"] == (
        "the admin surface is reachable from loopback only unless PAGEDCHAT_ADMIN_TOKEN is set"
    )


def test_admin_stream_refuses_a_bad_block_map_view(client):
    response = client.get("/api/admin/stream?start=20&end=10")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "end must be greater than start, got start 20 and end 10"
    assert (
        client.get("/api/admin/stream?cells=3").json()["error"]["message"]
        == "cells must be in [16, 8192], got 3"
    )


def test_security_headers_request_id_and_cookie(client):
    response = client.get("/api/sessions", headers={"x-request-id": "req-123"})
    assert response.headers["x-request-id"] == "req-123"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert "'unsafe-inline'" not in response.headers["content-security-policy"]
    fresh = TestClient(client.app).get("/api/sessions")
    cookie = fresh.headers["set-cookie"]
    assert cookie.startswith("pagedchat_browser=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "set-cookie" not in TestClient(client.app).get("/v1/models").headers
    generated = client.get("/health").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{16}", generated)


def test_api_key_is_required_on_v1(locked):
    anonymous = TestClient(locked.app)
    missing = anonymous.post("/v1/chat/completions", json={"messages": HELLO})
    assert missing.status_code == 401
    assert missing.json()["error"]["message"] == "missing API key: send 'Authorization: Bearer <key>'"
    wrong = anonymous.get("/v1/models", headers={"authorization": "Bearer sk-gamma"})
    assert (wrong.status_code, wrong.json()["error"]["message"]) == (401, "invalid API key")
    ok = anonymous.get("/v1/models", headers={"authorization": "Bearer sk-beta"})
    assert ok.status_code == 200


def test_sessions_of_an_api_key_are_its_own(locked):
    alpha = TestClient(locked.app, headers={"authorization": "Bearer sk-alpha"})
    beta = TestClient(locked.app, headers={"authorization": "Bearer sk-beta"})
    sid = alpha.post("/api/sessions", json={"title": "alpha's"}).json()["id"]
    assert beta.get(f"/api/sessions/{sid}").status_code == 404
    assert (
        TestClient(locked.app).get(f"/api/sessions/{sid}").status_code == 404
    )  # a browser cookie is not a key
    assert [s["id"] for s in alpha.get("/api/sessions").json()["sessions"]] == [sid]


def test_admin_token_is_required_when_configured(locked):
    assert locked.get("/api/admin/state").status_code == 401  # even from loopback
    wrong = locked.get("/api/admin/state", headers={"x-admin-token": "nope"})
    assert (wrong.status_code, wrong.json()["error"]["message"]) == (403, "invalid admin token")
    remote = TestClient(locked.app, client=("203.0.113.9", 4000))
    assert (
        remote.get("/api/admin/state", headers={"x-admin-token": "adm-token-0123456789"}).status_code == 200
    )


def test_queue_limit_gives_503_with_retry_after(locked):
    headers = {"authorization": "Bearer sk-alpha"}
    body = {"messages": HELLO, "max_tokens": 250, "temperature": 0, "stream": True}
    with locked.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        refused = locked.post(
            "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, headers=headers
        )
        for _ in lines:
            pass
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert (
        refused.json()["error"]["message"]
        == "the server is at its limit of 1 concurrent requests; retry shortly"
    )
    after = locked.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, headers=headers)
    assert after.status_code == 200


def test_session_sse_events_are_named(client):
    sid = client.post("/api/sessions", json={"settings": {"max_tokens": 3}}).json()["id"]
    with client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "hi"}) as response:
        events = sse_events(response.iter_lines())
    assert events[0]["event"] == "start" and events[-1]["event"] == "done"
    assert json.loads(events[-1]["data"])["usage"]["completion_tokens"] == 3

"""A 10-turn conversation with the real SmolLM2: every later turn reuses the whole previous prompt + answer."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.app.factories import smollm2_dir, sse_events

BLOCK = 16
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # layers * (K, V) * kv heads * head dim * fp32
# (user text, settings for that turn): short replies cut by length, sentences cut by a stop string, natural ends
TURNS = [
    ("What is the capital of France?", {"max_tokens": 8}),
    ("Why is the sky blue? Answer in one sentence.", {"max_tokens": 40, "stop": ["."]}),
    ("Say just 'yes'.", {"max_tokens": 24}),
    ("Name three fruits.", {"max_tokens": 6}),
    ("Write a sentence about cats.", {"max_tokens": 40, "stop": ["."]}),
    ("Tell me a long story about a dragon.", {"max_tokens": 60, "stop_button_after": 4}),
    ("What is 2 + 2?", {"max_tokens": 8}),
    ("Describe the ocean.", {"max_tokens": 40, "stop": [","]}),
    ("Thanks! Anything else?", {"max_tokens": 8}),
    ("Goodbye.", {"max_tokens": 24}),
]


def run_turn(http: httpx.Client, sid: str, content: str, stop_after: int | None) -> dict:
    with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": content}) as response:
        assert response.status_code == 200
        events, lines, num_deltas = [], [], 0
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith("event: delta"):
                num_deltas += 1
                if num_deltas == stop_after:
                    assert http.post(f"/api/sessions/{sid}/stop").json() == {"stopped": True}
        events = [json.loads(e["data"]) for e in sse_events(lines)]
    assert events[-1]["type"] == "done"
    return events[-1]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_ten_turns_hit_the_prefix_cache_for_all_earlier_tokens(server_factory):
    server = server_factory(
        model=str(smollm2_dir()),
        PAGEDCHAT_MAX_MODEL_LEN="2048",
        PAGEDCHAT_KV_CACHE_BYTES=str(4096 * SMOLLM2_KV_BYTES_PER_TOKEN),
    )
    with httpx.Client(base_url=server.base_url, timeout=120, headers={"origin": server.base_url}) as http:
        sid = http.post("/api/sessions", json={"system_prompt": "You are a concise assistant."}).json()["id"]
        previous, reasons = None, []
        for content, turn_settings in TURNS:
            stop_after = turn_settings.pop("stop_button_after", None)
            http.patch(f"/api/sessions/{sid}", json={"settings": {"temperature": 0, **turn_settings}})
            done = run_turn(http, sid, content, stop_after)
            usage, message = done["usage"], done["message"]
            assert message["status"] in ("finished", "stopped")
            assert message["truncated_turns"] == 0
            reasons.append(message["finish_reason"])
            if previous is not None:
                floor = (previous["prompt_tokens"] + previous["completion_tokens"] - 1) // BLOCK * BLOCK
                assert usage["prompt_tokens_details"]["cached_tokens"] >= floor, (content, usage, previous)
            previous = usage
        assert {"length", "stop", "abort"} <= set(reasons), reasons
    server.wait_pool_idle()

"""A 10-turn conversation: every later turn reuses the whole previous prompt + answer.

The tiny random model (SmolLM2's tokenizer): what is checked is the cache's bookkeeping across replies cut by
length, by a stop string and by the stop button, which does not depend on the model's words (the real model took
20 s of the suite for the same checks)."""

from __future__ import annotations

import json

import httpx

from tests.app.factories import TINY_BLOCK_BYTES, sse_events

BLOCK = 16
# (user text, settings for that turn): short replies cut by length, sentences cut by a stop string, natural ends
# (user text, settings for that turn): short replies cut by length, replies cut by a stop string (a random model's
# tokens are mostly words with a leading space or letter: a common letter ends them within a few tokens), a long
# reply stopped by the button after 4 deltas (400 tokens: still running when the stop lands)
TURNS = [
    ("What is the capital of France?", {"max_tokens": 8}),
    ("Why is the sky blue? Answer in one sentence.", {"max_tokens": 40, "stop": ["e"]}),
    ("Say just 'yes'.", {"max_tokens": 24}),
    ("Name three fruits.", {"max_tokens": 6}),
    ("Write a sentence about cats.", {"max_tokens": 40, "stop": ["a"]}),
    ("Tell me a long story about a dragon.", {"max_tokens": 400, "stop_button_after": 4}),
    ("What is 2 + 2?", {"max_tokens": 8}),
    ("Describe the ocean.", {"max_tokens": 40, "stop": ["o"]}),
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


def test_ten_turns_hit_the_prefix_cache_for_all_earlier_tokens(server_factory):
    server = server_factory(
        PAGEDCHAT_MAX_MODEL_LEN="1024", PAGEDCHAT_KV_CACHE_BYTES=str(4096 * TINY_BLOCK_BYTES)
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

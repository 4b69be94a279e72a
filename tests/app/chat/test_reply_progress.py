"""While a long prompt is read, a session reply says how far (SSE here; the socket sends the same events), and /v1
streams llama.cpp's `prompt_progress` chunks when the request sets `return_progress`."""

from __future__ import annotations

import json

import pytest

from tests.app.chat.test_routes_sessions import GREEDY, new_session, send
from tests.app.factories import make_client, sse_events

LONG = "a long pasted document " * 40  # ~200 tokens: several steps of 64


@pytest.fixture
def client(tmp_path):
    with make_client(tmp_path, max_num_batched_tokens=64) as c:
        yield c


def test_a_session_reply_reports_the_prompt_read_before_its_first_token(client):
    sid = new_session(client)
    events = send(client, sid, LONG)
    types = [e["type"] for e in events]
    progress = [e for e in events if e["type"] == "progress"]
    assert progress, types
    assert types.index("progress") < types.index("assistant_start")  # all before the first token
    assert max(i for i, t in enumerate(types) if t == "progress") < types.index("assistant_start")
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    total = progress[0]["total"]
    assert all(p["total"] == total and 0 < p["processed"] < total for p in progress)
    assert all(p["queue_position"] is None and p["cached"] == 0 for p in progress)
    # a follow-up with another long text: the history is read from the prefix cache, the new text step by step
    again = [e for e in send(client, sid, "and a second pasted note " * 25) if e["type"] == "progress"]
    assert again and again[0]["cached"] >= total - 16 and again[0]["total"] > total


def test_v1_streams_prompt_progress_chunks_only_when_asked(client):
    def stream(**extra) -> list[dict]:
        body = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 3, "stream": True, **GREEDY}
        with client.stream("POST", "/v1/chat/completions", json={**body, **extra}) as response:
            assert response.status_code == 200, response.read()
            data = [e["data"] for e in sse_events(response.iter_lines())]
        assert data[-1] == "[DONE]"
        return [json.loads(d) for d in data[:-1]]

    chunks = stream(return_progress=True)
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    first_content = next(i for i, c in enumerate(chunks) if c["choices"])
    assert progress and all("prompt_progress" in c for c in chunks[:first_content])
    assert all(c["choices"] == [] and c["object"] == "chat.completion.chunk" for c in chunks[:first_content])
    assert set(progress[0]) == {"total", "cache", "processed", "time_ms", "queue_position"}
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert not any("prompt_progress" in c for c in stream())  # not asked: llama.cpp's default too

"""A Stop before the first token drops the empty reply, as the CLI does: no "(no text)" row is kept, the user
message stays on show (the active leaf) to be edited or answered again, and the reply's blocks go back to the pool.
A slow engine (every step 0.2 s) reading a long prompt in steps of 64 tokens makes the Stop land while the prompt is
read."""

from __future__ import annotations

import pytest

from tests.app.factories import make_client, wait_pool_idle
from tests.faults import FaultPlan

LONG = "a long pasted document " * 40  # ~200 tokens: four steps of 64


@pytest.fixture
def client(tmp_path):
    with make_client(tmp_path, faults=FaultPlan(step_delay_s=0.2), max_num_batched_tokens=64) as c:
        yield c


def until_final(ws) -> list[dict]:
    frames = [ws.receive_json()]
    while frames[-1]["type"] != "done":
        frames.append(ws.receive_json())
    return frames


def test_a_stop_before_the_first_token_keeps_no_reply(client):
    sid = client.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 4}}).json()["id"]
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": LONG})
        frames = [ws.receive_json()]
        while frames[-1]["type"] != "progress":  # the prompt is being read: no token yet
            frames.append(ws.receive_json())
        ws.send_json({"type": "stop"})
        frames += until_final(ws)
        types = [f["type"] for f in frames]
        assert "assistant_start" not in types and "delta" not in types, types
        done = frames[-1]
        assert done["dropped"] is True
        assert (done["message"]["id"], done["message"]["status"], done["message"]["content"]) == (
            None,
            "stopped",
            "",
        )
        user_id = frames[0]["user_message"]["id"]
        wait_pool_idle(client)  # its blocks are back in the pool

        session = client.get(f"/api/sessions/{sid}").json()
        assert session["active_leaf_id"] == user_id
        assert [(m["role"], m["content"]) for m in session["messages"]] == [("user", LONG)]
        stored = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
        assert [m["role"] for m in stored] == ["user"]  # no empty reply anywhere in the tree

        ws.send_json({"type": "regenerate"})  # asked again: the user message gets its reply
        answered = until_final(ws)[-1]
    assert "dropped" not in answered
    assert (answered["message"]["status"], answered["message"]["parent_id"]) == ("finished", user_id)
    session = client.get(f"/api/sessions/{sid}").json()
    assert [m["role"] for m in session["messages"]] == ["user", "assistant"]
    assert session["active_leaf_id"] == answered["message"]["id"]


def test_a_stop_after_the_first_token_keeps_the_stopped_reply(client):
    sid = client.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 200}}).json()["id"]
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "Hi"})
        while ws.receive_json()["type"] != "delta":
            pass
        ws.send_json({"type": "stop"})
        done = until_final(ws)[-1]
    assert (
        "dropped" not in done and done["message"]["status"] == "stopped" and done["message"]["id"] is not None
    )
    session = client.get(f"/api/sessions/{sid}").json()
    assert [m["role"] for m in session["messages"]] == ["user", "assistant"]
    assert session["active_leaf_id"] == done["message"]["id"]

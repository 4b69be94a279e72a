"""Sessions over plain HTTP and the chat socket over `websockets`, against a real server."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.app.factories import sse_events


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=30, headers={"origin": server.base_url}) as client:
        yield client


def new_session(http, **settings) -> str:
    response = http.post("/api/sessions", json={"title": "e2e", "settings": {"temperature": 0, **settings}})
    assert response.status_code == 201
    return response.json()["id"]


def open_socket(server, http, sid: str, **kwargs):
    cookie = f"pagedchat_browser={http.cookies['pagedchat_browser']}"
    return connect(f"{server.ws_url}/ws/sessions/{sid}", additional_headers={"Cookie": cookie}, **kwargs)


def until_done(ws) -> list[dict]:
    frames = []
    while not frames or frames[-1]["type"] != "done":
        frames.append(json.loads(ws.recv(timeout=30)))
    return frames


def test_session_crud_and_sse_reply(server, http):
    sid = new_session(http, max_tokens=5)
    assert http.patch(f"/api/sessions/{sid}", json={"title": "renamed"}).json()["title"] == "renamed"
    with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Hello"}) as response:
        events = [json.loads(e["data"]) for e in sse_events(response.iter_lines())]
    done = events[-1]
    assert (done["type"], done["message"]["status"], done["usage"]["completion_tokens"]) == (
        "done",
        "finished",
        5,
    )
    body = http.get(f"/api/sessions/{sid}").json()
    assert [m["role"] for m in body["messages"]] == ["user", "assistant"]
    assert body["messages"][1]["content"] == done["message"]["content"]
    assert sid in [s["id"] for s in http.get("/api/sessions").json()["sessions"]]
    assert http.delete(f"/api/sessions/{sid}").status_code == 204
    assert http.get(f"/api/sessions/{sid}").status_code == 404


def test_socket_chat_with_cache_reuse_across_turns(server, http):
    sid = new_session(http, max_tokens=8)
    with open_socket(server, http, sid) as ws:
        ws.send(json.dumps({"type": "message", "content": "First turn"}))
        first = until_done(ws)[-1]
        ws.send(json.dumps({"type": "message", "content": "Second turn"}))
        second = until_done(ws)
    assert [f["type"] for f in second[:2]] == ["start", "assistant_start"]
    assert second[0]["exact_extension"] is True
    floor = (first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1) // 16 * 16
    assert second[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= floor
    assert second[-1]["message"]["content"] == "".join(f["text"] for f in second if f["type"] == "delta")


def test_socket_branches_continue_regenerate_edit_and_switch(server, http):
    """Every turn frame names the message it extends; each branch reuses its common history's full blocks."""
    sid = new_session(http, max_tokens=8)

    def full_blocks(num_tokens: int) -> int:
        return num_tokens // 16 * 16

    def cached(frames: list[dict]) -> int:
        return frames[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]

    with open_socket(server, http, sid) as ws:
        ws.send(json.dumps({"type": "message", "content": "One."}))
        cut = until_done(ws)[-1]["message"]
        u1, a1, num_computed = cut["parent_id"], cut["id"], cut["prompt_tokens"] + 7
        assert cut["finish_reason"] == "length"
        ws.send(json.dumps({"type": "continue", "message_id": a1}))
        grown = until_done(ws)
        assert (grown[0]["mode"], grown[1]["message_id"], grown[1]["continues"]) == ("continue", a1, True)
        assert (
            grown[-1]["usage"]["prompt_tokens"] == cut["prompt_tokens"] + 8
        )  # history + the reply's own ids
        assert cached(grown) >= full_blocks(num_computed)
        assert grown[-1]["message"]["content"].startswith(cut["content"])
        ws.send(json.dumps({"type": "message", "content": "Two."}))
        second = until_done(ws)
        u2 = second[0]["user_message"]["id"]
        assert second[0]["user_message"]["parent_id"] == a1

        ws.send(json.dumps({"type": "regenerate", "message_id": a1}))  # a reply with turns after it
        again = until_done(ws)
        assert again[1]["sibling_ids"] == [a1, again[-1]["message"]["id"]]
        assert cached(again) >= full_blocks(cut["prompt_tokens"] - 1)
        ws.send(
            json.dumps({"type": "edit", "message_id": u2, "content": "Two, edited."})
        )  # off the branch on show
        edited = until_done(ws)
        assert edited[0]["user_message"]["sibling_ids"] == [u2, edited[0]["user_message"]["id"]]
        # the fork is after a1: the second turn's prompt held the history through a1's 16 tokens
        assert cached(edited) >= full_blocks(cut["prompt_tokens"] + 16)

        ws.send(json.dumps({"type": "branch", "message_id": again[-1]["message"]["id"]}))
        switched = json.loads(ws.recv(timeout=30))
        assert switched["type"] == "branch" and [m["id"] for m in switched["messages"]] == [
            u1,
            again[-1]["message"]["id"],
        ]
        ws.send(json.dumps({"type": "continue", "message_id": u1}))
        refused = json.loads(ws.recv(timeout=30))
        assert (refused["type"], refused["status"], refused["param"]) == ("error", 400, "message_id")
        assert refused["message"] == f"message_id {u1} is a user message: continue takes a reply"
        ws.send(json.dumps({"type": "ping"}))  # the socket stays open
        assert json.loads(ws.recv(timeout=30)) == {"type": "pong"}
    shown = http.get(f"/api/sessions/{sid}").json()
    assert shown["active_leaf_id"] == again[-1]["message"]["id"] and shown["messages"] == switched["messages"]
    server.wait_pool_idle()


def test_stop_over_the_socket_aborts_and_frees_every_block(server, http):
    # a reply long enough to be stopped mid-way: its 250 tokens of repeats (n-gram speculation accepts most) once
    # ended before a loaded machine let this test look at the pool (cached and free blocks, none in use)
    sid = new_session(http, max_tokens=2000)
    with open_socket(server, http, sid) as ws:
        ws.send(json.dumps({"type": "message", "content": "Go on and on"}))
        while json.loads(ws.recv(timeout=30))["type"] != "delta":
            pass
        assert "u" in server.admin_state()["block_states"]
        ws.send(json.dumps({"type": "stop"}))
        frames = until_done(ws)
        ws.send(json.dumps({"type": "nonsense"}))  # error frames keep the socket open
        error = json.loads(ws.recv(timeout=30))
        assert (error["type"], error["status"], error["param"]) == ("error", 400, "type")
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=30)) == {"type": "pong"}
    assert {"type": "stop_ack", "stopped": True} in frames
    done = frames[-1]
    assert (done["message"]["status"], done["message"]["finish_reason"]) == ("stopped", "abort")
    assert done["usage"]["completion_tokens"] < 2000
    server.wait_pool_idle()
    stored = httpx.get(f"{server.base_url}/api/sessions/{sid}/messages", cookies=http.cookies).json()[
        "messages"
    ]
    assert stored[-1]["status"] == "stopped"


def test_closing_the_socket_mid_reply_aborts_it(server, http):
    sid = new_session(http, max_tokens=250)
    with open_socket(server, http, sid) as ws:
        ws.send(json.dumps({"type": "message", "content": "Keep talking"}))
        while json.loads(ws.recv(timeout=30))["type"] != "delta":
            pass
    server.wait_pool_idle()
    stored = http.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert stored[-1]["status"] == "interrupted" and stored[-1]["completion_tokens"] < 250


def test_sse_disconnect_mid_reply_aborts_it_and_stores_it_interrupted(server, http):
    sid = new_session(http, max_tokens=250)
    with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Ramble"}) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("event: delta"):
            pass
    server.wait_pool_idle()
    stored = http.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert stored[-1]["status"] == "interrupted" and stored[-1]["completion_tokens"] < 250


def test_cross_origin_socket_is_refused_and_strangers_get_404(server, http):
    sid = new_session(http)
    with pytest.raises(InvalidStatus) as refused:
        open_socket(server, http, sid, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    with open_socket(server, http, sid, origin=server.base_url) as ws:
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=30)) == {"type": "pong"}
    with httpx.Client(base_url=server.base_url) as stranger:
        assert stranger.get(f"/api/sessions/{sid}").status_code == 404
        with open_socket(server, stranger, sid) as ws:
            error = json.loads(ws.recv(timeout=30))
    assert (error["status"], error["message"]) == (404, f"session {sid!r} not found")

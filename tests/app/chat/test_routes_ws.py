"""WS /ws/sessions/{id} against the real tiny engine: frames, error frames that keep the socket, stop, 409, Origin."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.app.factories import make_client, wait_pool_idle


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("ws"), ws_max_frame_bytes=4096) as c:
        yield c


def new_session(client, max_tokens: int = 6) -> str:
    return client.post(
        "/api/sessions", json={"settings": {"temperature": 0, "max_tokens": max_tokens}}
    ).json()["id"]


def until_final(ws) -> list[dict]:
    frames = []
    while True:
        frames.append(ws.receive_json())
        if frames[-1]["type"] == "done":
            return frames


def test_message_streams_deltas_then_a_final_message(client):
    sid = new_session(client)
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "Hi there"})
        frames = until_final(ws)
    assert [f["type"] for f in frames[:2]] == ["start", "assistant_start"]
    done = frames[-1]
    assert done["type"] == "done"
    text = "".join(f["text"] for f in frames if f["type"] == "delta")
    assert done["message"]["content"] == text
    assert (done["message"]["status"], done["usage"]["completion_tokens"]) == ("finished", 6)
    assert "cached_tokens" in done["usage"]["prompt_tokens_details"]
    assert {"total_s", "ttft_s"} <= set(done["timings"])
    stored = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [(m["role"], m["content"]) for m in stored] == [("user", "Hi there"), ("assistant", text)]


def test_bad_frames_get_error_frames_and_the_socket_stays_open(client):
    sid = new_session(client)
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_text("{nope")
        assert ws.receive_json()["message"].startswith("frame is not valid JSON")
        ws.send_json([1, 2])
        assert ws.receive_json()["message"] == "frame must be a JSON object with a string 'type'"
        ws.send_json({"type": "dance"})
        error = ws.receive_json()
        assert (error["type"], error["status"], error["param"]) == ("error", 400, "type")
        assert error["message"].startswith("unknown frame type 'dance'")
        ws.send_json({"type": "message", "content": 42})
        error = ws.receive_json()
        assert (error["status"], error["param"], error["message"]) == (
            400,
            "content",
            "content must be a non-empty string",
        )
        ws.send_bytes(b"\x00\x01")
        assert ws.receive_json()["message"] == "binary frames are not supported: send JSON text"
        ws.send_json({"type": "ping"})
        assert ws.receive_json() == {"type": "pong"}
        ws.send_json({"type": "message", "content": "still here?"})
        assert until_final(ws)[-1]["type"] == "done"


def test_second_message_while_streaming_is_an_error_frame_and_stop_ends_the_reply(client):
    sid = new_session(client, max_tokens=250)
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "A long answer please"})
        frames = [ws.receive_json()]
        while frames[-1]["type"] != "delta":
            frames.append(ws.receive_json())
        ws.send_json({"type": "message", "content": "interrupting"})
        ws.send_json({"type": "stop"})
        frames += until_final(ws)
        busy = next(f for f in frames if f["type"] == "error")
        assert (busy["status"], busy["code"]) == (409, "reply_in_progress")
        ack = next(f for f in frames if f["type"] == "stop_ack")
        assert ack == {"type": "stop_ack", "stopped": True}
        done = frames[-1]
        assert (done["type"], done["message"]["status"], done["message"]["finish_reason"]) == (
            "done",
            "stopped",
            "abort",
        )
        assert done["usage"]["completion_tokens"] < 250
        ws.send_json({"type": "regenerate"})  # the socket still serves: regenerate the stopped reply
        regenerated = until_final(ws)[-1]
    assert (regenerated["message"]["status"], regenerated["usage"]["completion_tokens"]) == ("finished", 250)
    stored = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    wait_pool_idle(client)


def test_closing_the_socket_mid_reply_aborts_it(client):
    sid = new_session(client, max_tokens=250)
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "Talk for a while"})
        while ws.receive_json()["type"] != "delta":
            pass
    wait_pool_idle(client)
    # the reply's row is written once its stream has ended, which may be a moment after its blocks went back
    deadline = time.monotonic() + 5
    while (stored := client.get(f"/api/sessions/{sid}/messages").json()["messages"])[-1][
        "status"
    ] == "streaming" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stored[-1]["status"] == "interrupted"  # a dropped socket, not the user's stop
    assert stored[-1]["completion_tokens"] < 250


def test_edit_frame_without_an_id_branches_at_the_last_user_message(client):
    sid = new_session(client)
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "orginal typo"})
        until_final(ws)
        ws.send_json({"type": "edit", "content": "original, fixed"})
        done = until_final(ws)[-1]
    stored = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [m["content"] for m in stored] == ["original, fixed", done["message"]["content"]]
    assert len(stored[0]["sibling_ids"]) == 2 and stored[0]["sibling_index"] == 1  # the typo: version 1


def test_oversized_frame_closes_with_1009(client):
    sid = new_session(client)
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "x" * 5000})
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 1009


def test_unknown_session_gets_an_error_frame_and_4404(client):
    with client.websocket_connect("/ws/sessions/missing") as ws:
        error = ws.receive_json()
        assert (error["status"], error["message"]) == (404, "session 'missing' not found")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 4404


def test_another_browser_cannot_open_the_socket(client):
    sid = new_session(client)
    stranger = TestClient(client.app)
    stranger.get("/health")  # no cookie is handed out on /health
    with pytest.raises(WebSocketDisconnect) as rejected, stranger.websocket_connect(f"/ws/sessions/{sid}"):
        pass
    assert rejected.value.code == 1008
    stranger.post("/api/sessions")  # now it has its own cookie, but the session is still not its own
    with stranger.websocket_connect(f"/ws/sessions/{sid}") as ws:
        assert ws.receive_json()["status"] == 404


def test_cross_origin_upgrade_is_refused(client):
    sid = new_session(client)
    with (
        pytest.raises(WebSocketDisconnect) as rejected,
        client.websocket_connect(f"/ws/sessions/{sid}", headers={"origin": "http://evil.example"}),
    ):
        pass
    assert rejected.value.code == 1008
    with client.websocket_connect(f"/ws/sessions/{sid}", headers={"origin": "http://testserver"}) as ws:
        ws.send_json({"type": "ping"})
        assert ws.receive_json() == {"type": "pong"}

"""Session API against the real tiny engine: CRUD, ownership, SSE replies, caching across turns, stop/regenerate/edit."""

from __future__ import annotations

import json
import time

import pytest
from starlette.testclient import TestClient

from tests.app.factories import SAME_ORIGIN, make_client, sse_events, wait_pool_idle

BLOCK = 16
GREEDY = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("sessions")) as c:
        yield c


def new_session(client, **fields) -> str:
    response = client.post("/api/sessions", json={"settings": GREEDY, **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def send(client, sid: str, content: str, path: str = "messages", **fields) -> list[dict]:
    """POST a message and return the parsed SSE events (each event's data as a dict)."""
    with client.stream(
        "POST", f"/api/sessions/{sid}/{path}", json={"content": content, **fields}
    ) as response:
        assert response.status_code == 200, response.read()
        events = sse_events(response.iter_lines())
    parsed = [json.loads(e["data"]) for e in events]
    assert [e["event"] for e in events] == [p["type"] for p in parsed]
    return parsed


def messages(client, sid: str) -> list[dict]:
    response = client.get(f"/api/sessions/{sid}/messages")
    assert response.status_code == 200
    return response.json()["messages"]


def test_create_list_rename_delete(client):
    sid = new_session(client, title="First", system_prompt="Be brief.")
    listed = client.get("/api/sessions").json()["sessions"]
    assert sid in [s["id"] for s in listed]
    renamed = client.patch(f"/api/sessions/{sid}", json={"title": "Renamed"}).json()
    assert (renamed["title"], renamed["system_prompt"], renamed["settings"]) == (
        "Renamed",
        "Be brief.",
        GREEDY,
    )
    assert client.get(f"/api/sessions/{sid}").json()["messages"] == []
    assert client.delete(f"/api/sessions/{sid}").status_code == 204
    assert client.get(f"/api/sessions/{sid}").status_code == 404
    assert client.delete(f"/api/sessions/{sid}").status_code == 404


def test_empty_body_creates_a_default_session(client):
    response = client.post("/api/sessions")
    assert response.status_code == 201
    assert (response.json()["title"], response.json()["settings"]) == ("New chat", {})


def test_another_browser_sees_nothing(client):
    sid = new_session(client)
    # no lifespan of its own: the same running app, no cookie yet (writing from the app's own page)
    stranger = TestClient(client.app, headers=SAME_ORIGIN)
    assert stranger.get("/api/sessions").json() == {"sessions": []}
    assert stranger.get(f"/api/sessions/{sid}").status_code == 404
    assert stranger.get(f"/api/sessions/{sid}/messages").status_code == 404
    assert stranger.patch(f"/api/sessions/{sid}", json={"title": "mine"}).status_code == 404
    assert stranger.post(f"/api/sessions/{sid}/messages", json={"content": "hi"}).status_code == 404
    assert stranger.delete(f"/api/sessions/{sid}").status_code == 404
    assert client.get(f"/api/sessions/{sid}").json()["title"] == "New chat"


def test_forged_cookie_is_a_new_identity(client):
    sid = new_session(client)
    forged = TestClient(
        client.app, cookies={"pagedchat_browser": client.cookies["pagedchat_browser"][:-2] + "xx"}
    )
    assert forged.get(f"/api/sessions/{sid}").status_code == 404


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (
            {"settings": {"temperature": -1}},
            "settings.temperature",
            "settings.temperature must be in [0, 2] for a chat, got -1",
        ),
        (
            {"settings": {"max_tokens": 0}},
            "settings.max_tokens",
            "settings.max_tokens must be a positive integer",
        ),
        ({"settings": {"colour": "red"}}, "settings", "settings.colour is not a known setting"),
        ({"settings": []}, "settings", "settings must be an object"),
        ({"title": 5}, "title", "title must be a string"),
        ({"title": "x" * 201}, "title", "title is 201 characters long, over the limit of 200"),
    ],
)
def test_invalid_session_fields_are_400(client, body, param, fragment):
    response = client.post("/api/sessions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fragment in response.json()["error"]["message"]


def test_reply_streams_and_is_stored(client):
    sid = new_session(client)
    events = send(client, sid, "Hello!")
    assert [e["type"] for e in events[:2]] == ["start", "assistant_start"]
    assert events[-1]["type"] == "done"
    deltas = [e["text"] for e in events if e["type"] == "delta"]
    done = events[-1]
    assert done["message"]["content"] == "".join(deltas)
    assert done["message"]["status"] == "finished"
    assert done["message"]["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 8
    assert done["usage"]["prompt_tokens"] == events[0]["prompt_tokens"]
    assert set(done["timings"]) == {"total_s", "ttft_s", "decode_tokens_per_s"}
    stored = messages(client, sid)
    assert [(m["role"], m["status"]) for m in stored] == [("user", "complete"), ("assistant", "finished")]
    assert stored[0]["content"] == "Hello!"
    assert stored[1]["content"] == done["message"]["content"]
    assert stored[1]["completion_tokens"] == 8
    assert stored[1]["prompt_tokens"] == events[0]["prompt_tokens"]


def test_later_turns_hit_the_cache_for_the_whole_history(client):
    sid = new_session(client, system_prompt="You are a careful assistant.")
    previous = None
    for text in ["First question?", "Second one.", "And a third, a bit longer than the others."]:
        done = send(client, sid, text)[-1]
        usage = done["usage"]
        if previous is not None:
            floor = (previous["prompt_tokens"] + previous["completion_tokens"] - 1) // BLOCK * BLOCK
            assert usage["prompt_tokens_details"]["cached_tokens"] >= floor
            assert usage["prompt_tokens"] > previous["prompt_tokens"] + previous["completion_tokens"]
        previous = usage
    wait_pool_idle(client)


def test_oldest_turns_are_left_out_when_the_user_chose_so(client):
    sid = new_session(client, settings={"temperature": 0, "max_tokens": 250})
    first = send(client, sid, "Tell me a long story.")[-1]
    assert first["message"]["truncated_turns"] == 0
    refused = client.post(f"/api/sessions/{sid}/messages", json={"content": "Go on."})
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "context_full")
    # 31 + 250 + 10 + 250 > 512: the first exchange is left out
    second = send(client, sid, "Go on.", truncate="oldest")[-1]
    assert second["message"]["status"] == "finished"
    assert second["message"]["truncated_turns"] == 1
    assert messages(client, sid)[-1]["truncated_turns"] == 1


def test_second_message_while_streaming_is_409_and_stop_stores_stopped(client):
    sid = new_session(client, settings={"temperature": 0, "max_tokens": 250})
    with client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Long one"}) as response:
        lines = response.iter_lines()
        seen = []
        for line in lines:
            seen.append(line)
            if line.startswith("event: delta"):
                break
        busy = client.post(f"/api/sessions/{sid}/messages", json={"content": "me too"})
        assert busy.status_code == 409
        assert busy.json()["error"]["message"] == (
            "a reply is still streaming in this session: stop it or wait for it to finish"
        )
        assert client.get(f"/api/sessions/{sid}").json()["streaming"] is True
        assert client.post(f"/api/sessions/{sid}/stop").json() == {"stopped": True}
        events = sse_events([*seen, *lines])
    done = json.loads(events[-1]["data"])
    assert done["type"] == "done"
    assert (done["message"]["status"], done["message"]["finish_reason"]) == ("stopped", "abort")
    assert done["usage"]["completion_tokens"] < 250
    stored = messages(client, sid)
    assert [m["role"] for m in stored] == ["user", "assistant"]  # "me too" was refused, not stored
    assert (stored[1]["status"], stored[1]["content"]) == ("stopped", done["message"]["content"])
    assert client.post(f"/api/sessions/{sid}/stop").json() == {"stopped": False}
    wait_pool_idle(client)


def test_partial_reply_is_flushed_while_streaming(client):
    sid = new_session(client, settings={"temperature": 0, "max_tokens": 250})
    with client.stream(
        "POST", f"/api/sessions/{sid}/messages", json={"content": "Stream slowly"}
    ) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("event: delta"):
                break
        time.sleep(0.15)  # > flush_interval_s (0.05 in tests)
        partial = messages(client, sid)[-1]
        client.post(f"/api/sessions/{sid}/stop")
        final = json.loads(sse_events(lines)[-1]["data"])["message"]
    assert partial["status"] == "streaming"
    assert partial["content"] and final["content"].startswith(partial["content"])


def test_regenerate_shows_a_new_version_of_the_last_reply(client):
    sid = new_session(client)
    first = send(client, sid, "Pick a word.")[-1]
    again = send(client, sid, "", path="regenerate")[-1]
    stored = messages(client, sid)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    # the first reply is kept as the other version
    assert stored[1]["sibling_ids"] == [first["message"]["id"], again["message"]["id"]]
    assert stored[0]["content"] == "Pick a word."
    assert again["message"]["content"] == first["message"]["content"]  # greedy: the same reply
    prompt = first["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens"] == prompt
    # the prompt's full blocks, and where the first reply filled the prompt's last block, a copy of it up to the
    # last prompt token (which is always computed)
    filled = ((prompt - 1) // BLOCK + 1) * BLOCK <= prompt + 8 - 1
    expected = prompt - 1 if filled else (prompt - 1) // BLOCK * BLOCK
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == expected


def test_edit_branches_at_the_last_user_turn_and_reuses_the_history(client):
    sid = new_session(client)
    turn1 = send(client, sid, "One.")[-1]["usage"]
    send(client, sid, "Two.")
    edited = send(client, sid, "Two, edited.", path="edit")[-1]
    stored = messages(client, sid)
    assert [(m["role"], m["content"]) for m in stored[:3]] == [
        ("user", "One."),
        ("assistant", stored[1]["content"]),
        ("user", "Two, edited."),
    ]
    assert len(stored) == 4 and stored[3]["content"] == edited["message"]["content"]
    floor = (turn1["prompt_tokens"] + turn1["completion_tokens"] - 1) // BLOCK * BLOCK
    assert edited["usage"]["prompt_tokens_details"]["cached_tokens"] >= floor


def test_reply_errors_are_400_404(client):
    sid = new_session(client)
    empty = client.post(f"/api/sessions/{sid}/messages", json={"content": "  "})
    assert (empty.status_code, empty.json()["error"]["param"]) == (400, "content")
    nothing = client.post(f"/api/sessions/{sid}/regenerate")
    assert nothing.status_code == 400
    assert nothing.json()["error"]["message"] == "nothing to regenerate: the session has no user message yet"
    missing = client.post("/api/sessions/nope/messages", json={"content": "hi"})
    assert (missing.status_code, missing.json()["error"]["message"]) == (404, "session 'nope' not found")
    assert messages(client, sid) == []

"""A conversation that outgrows the context (#39 item 3), on the tiny engine with max_model_len 512: the plan
endpoint says what a send needs; a send whose history must be cut is refused (409 `context_full`, over HTTP and the
socket) until it names a choice; a message that cannot fit at all is refused saying what to do; nothing is stored."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from app.http.security import BROWSER_COOKIE
from tests.app.factories import LOOPBACK_CLIENT, SAME_ORIGIN, make_client, sse_events, wait_pool_idle

GREEDY = {"temperature": 0, "max_tokens": 8}
DOCUMENT = "The apple orchard report. " + "apples and pears grow here. " * 45  # ~280 tokens
FOLLOW_UP = "Now compare: " + "pears and plums grow there. " * 35  # ~220 tokens: both do not fit 504


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("context")) as c:
        yield c


def new_session(client: TestClient) -> str:
    response = client.post("/api/sessions", json={"settings": GREEDY})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def send(client: TestClient, sid: str, content: str, **fields) -> list[dict]:
    with client.stream(
        "POST", f"/api/sessions/{sid}/messages", json={"content": content, **fields}
    ) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(e["data"]) for e in sse_events(response.iter_lines())]


def messages(client: TestClient, sid: str) -> list[dict]:
    return client.get(f"/api/sessions/{sid}/messages").json()["messages"]


def plan(client: TestClient, sid: str, content: str) -> dict:
    response = client.post(f"/api/sessions/{sid}/plan", json={"content": content})
    assert response.status_code == 200, response.text
    return response.json()


def session_with_document(client: TestClient) -> str:
    sid = new_session(client)
    assert plan(client, sid, DOCUMENT)["fits"] is True
    assert send(client, sid, DOCUMENT)[-1]["message"]["status"] == "finished"
    return sid


def test_plan_of_a_message_that_fits(client):
    sid = new_session(client)
    answer = plan(client, sid, "Hello there")
    assert answer == {
        "prompt_tokens": answer["prompt_tokens"],
        "max_tokens": 8,
        "max_model_len": 512,
        "fits": True,
        "truncated_turns": 0,
        "pinned_turns_dropped": 0,
        "options": [],
        "advice": None,
    }
    done = send(client, sid, "Hello there")
    assert done[0]["prompt_tokens"] == answer["prompt_tokens"]  # the plan is the send's own planning
    assert messages(client, sid)[0]["content"] == "Hello there"


def test_a_history_that_must_be_cut_is_refused_with_the_choices_until_one_is_made(client):
    sid = session_with_document(client)
    answer = plan(client, sid, FOLLOW_UP)
    assert answer["prompt_tokens"] + 8 > 512
    assert (answer["fits"], answer["truncated_turns"], answer["pinned_turns_dropped"]) == (False, 1, 0)
    assert answer["options"] == ["oldest", "summary"]
    assert answer["advice"].startswith("the conversation no longer fits the context: 1 earlier exchange")
    # no choice: 409, nothing stored
    response = client.post(f"/api/sessions/{sid}/messages", json={"content": FOLLOW_UP})
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"], error["message"]) == (
        "context_full",
        "conflict_error",
        answer["advice"],
    )
    assert error["context"] == answer
    assert len(messages(client, sid)) == 2
    # a bad choice is a 400 naming the values
    response = client.post(f"/api/sessions/{sid}/messages", json={"content": FOLLOW_UP, "truncate": "newest"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "truncate must be one of 'oldest', 'keep_pinned' or null, got 'newest'"
    )
    # the choice made: the document's exchange is left out, and the stored reply says so
    events = send(client, sid, FOLLOW_UP, truncate="oldest")
    assert events[0]["truncated_turns"] == 1
    assert events[0]["prompt_tokens"] < answer["prompt_tokens"]
    assert events[-1]["message"]["truncated_turns"] == 1
    stored = messages(client, sid)
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[-1]["truncated_turns"] == 1
    wait_pool_idle(client)


def test_the_socket_refuses_the_same_way_and_sends_with_a_choice(client):
    sid = session_with_document(client)
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": FOLLOW_UP})
        error = ws.receive_json()
        assert (error["type"], error["status"], error["code"]) == ("error", 409, "context_full")
        assert error["context"]["options"] == ["oldest", "summary"]
        assert len(messages(client, sid)) == 2
        ws.send_json({"type": "message", "content": FOLLOW_UP, "truncate": "keep_pinned"})
        frames = [ws.receive_json()]
        while frames[-1]["type"] != "done":
            frames.append(ws.receive_json())
    assert (
        frames[0]["type"] == "start" and frames[0]["truncated_turns"] == 1
    )  # nothing pinned: the oldest goes
    assert frames[-1]["message"]["truncated_turns"] == 1
    wait_pool_idle(client)


def test_a_message_that_cannot_fit_is_refused_saying_what_to_do(client):
    sid = session_with_document(client)
    huge = "A very long document. " + "lorem ipsum dolor sit amet " * 120
    answer = plan(client, sid, huge)
    assert (answer["fits"], answer["options"], answer["truncated_turns"]) == (False, [], 0)
    assert "send a shorter message" in answer["advice"] and "--max-model-len" in answer["advice"]
    assert "max_tokens" in answer["advice"]
    for truncate in (None, "oldest"):
        response = client.post(f"/api/sessions/{sid}/messages", json={"content": huge, "truncate": truncate})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"], error["message"]) == (
            "prompt_too_long",
            "content",
            answer["advice"],
        )
    assert len(messages(client, sid)) == 2


def test_plan_checks_the_content_and_the_owner_and_refuses_other_sites(client):
    sid = new_session(client)
    response = client.post(f"/api/sessions/{sid}/plan", json={"content": "  "})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "content")
    response = client.post(f"/api/sessions/{sid}/plan", json={"content": "x" * 200_001})
    assert response.status_code in (400, 413)
    assert client.post("/api/sessions/nope/plan", json={"content": "Hi"}).status_code == 404
    # another browser (its own cookie) does not see the session
    other = TestClient(client.app, client=LOOPBACK_CLIENT, headers=SAME_ORIGIN)
    other.portal = client.portal
    assert other.get("/").status_code == 200 and BROWSER_COOKIE in other.cookies
    response = other.post(f"/api/sessions/{sid}/plan", json={"content": "Hi"})
    assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")
    # the owner's cookie from another site's page: refused before anything is read
    response = client.post(
        f"/api/sessions/{sid}/plan", json={"content": "Hi"}, headers={"origin": "http://evil.example"}
    )
    assert response.status_code == 403, response.text
    assert messages(client, sid) == []


def test_a_new_chat_starts_from_a_summary_of_one_that_no_longer_fits(client):
    sid = session_with_document(client)
    assert "summary" in plan(client, sid, FOLLOW_UP)["options"]
    response = client.post(f"/api/sessions/{sid}/summarize", json={})
    assert response.status_code == 201, response.text
    made = response.json()
    new = made["session"]
    assert made["summary"] and made["truncated_turns"] == 0  # the document's exchange fits beside the request
    assert new["id"] != sid and new["settings"] == GREEDY
    assert new["system_prompt"] == (
        "Summary of an earlier conversation (the chat it continues):\n" + made["summary"]
    )
    assert new["id"] in [s["id"] for s in client.get("/api/sessions").json()["sessions"]]
    wait_pool_idle(client)  # the summary's request gave its blocks back
    # the message that did not fit goes to the new chat, whole
    events = send(client, new["id"], FOLLOW_UP)
    assert (events[0]["truncated_turns"], events[-1]["message"]["status"]) == (0, "finished")
    assert [m["content"] for m in messages(client, new["id"])][0] == FOLLOW_UP
    assert len(messages(client, new["id"])) == 2
    assert len(messages(client, sid)) == 2  # the old chat is unchanged
    wait_pool_idle(client)


def test_summarize_needs_messages_and_the_owner(client):
    sid = new_session(client)
    response = client.post(f"/api/sessions/{sid}/summarize", json={})
    assert (response.status_code, response.json()["error"]["message"]) == (
        400,
        "this chat has no messages to summarize",
    )
    assert client.post("/api/sessions/nope/summarize", json={}).status_code == 404
    response = client.post(
        f"/api/sessions/{sid}/summarize", json={}, headers={"origin": "http://evil.example"}
    )
    assert response.status_code == 403

"""Quotas through the HTTP API and the socket: per-owner sessions, messages and bytes, the database guard (507), and
new browser identities rate-limited per client address (429)."""

from __future__ import annotations

import itertools
import json

import pytest
from starlette.testclient import TestClient

from app.admin.feed import admin_feed
from app.http.security import BROWSER_COOKIE
from tests.app.factories import SAME_ORIGIN, make_client, sse_events

GREEDY = {"temperature": 0, "max_tokens": 4}
_ADDRESSES = (
    f"198.51.100.{i}" for i in itertools.count(1)
)  # each browser of a test from an address of its own


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("quotas"),
        max_sessions_per_owner=3,
        max_messages_per_owner=4,
        max_bytes_per_owner=1000,
        new_identities_per_minute=2,
    ) as c:
        yield c


def browser(client: TestClient, address: str | None = None) -> TestClient:
    """Another browser of the running app on the chat page's origin, from its own address (no cookie yet)."""
    other = TestClient(client.app, client=(address or next(_ADDRESSES), 40000), headers=SAME_ORIGIN)
    other.portal = client.portal  # the app's one event loop
    return other


def check_quota(response, limit_name: str, limit: int) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert f"over the limit of {limit} " in error["message"] and f"({limit_name})" in error["message"], error


def new_session(user: TestClient, **fields) -> str:
    response = user.post("/api/sessions", json={"settings": GREEDY, **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def send(user: TestClient, sid: str, content: str, path: str = "messages"):
    with user.stream("POST", f"/api/sessions/{sid}/{path}", json={"content": content}) as response:
        response.read()
    return response


def test_the_session_past_the_owner_limit_is_refused(client):
    user = browser(client)
    sids = [new_session(user) for _ in range(3)]
    check_quota(user.post("/api/sessions", json={"title": "4th"}), "max_sessions_per_owner", 3)
    assert sorted(s["id"] for s in user.get("/api/sessions").json()["sessions"]) == sorted(sids)
    assert new_session(browser(client))  # another owner has room of its own
    assert user.delete(f"/api/sessions/{sids[0]}").status_code == 204
    assert new_session(user)  # deleting makes room


def test_messages_past_the_owner_limit_are_refused_over_http_and_the_socket(client):
    user = browser(client)
    sid = new_session(user)
    for content in ("Hi", "Again"):
        assert send(user, sid, content).status_code == 200
    check_quota(send(user, sid, "third"), "max_messages_per_owner", 4)
    with user.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "over the socket"})
        frame = ws.receive_json()
    assert (frame["type"], frame["status"], frame["code"]) == ("error", 403, "quota_exceeded")
    assert "max_messages_per_owner" in frame["message"]
    messages = user.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["Hi", "Again"]
    # a regenerate keeps the old reply as a version beside the new one: a fifth message, refused at the limit (over
    # HTTP and the socket), else every regenerate would store one more reply past the quota
    check_quota(send(user, sid, "", path="regenerate"), "max_messages_per_owner", 4)
    with user.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "regenerate"})
        frame = ws.receive_json()
    assert (frame["type"], frame["status"], frame["code"]) == ("error", 403, "quota_exceeded")
    assert (
        len(user.get(f"/api/sessions/{sid}/export").json()["messages"]) == 4
    )  # every version of every message
    # with room, a regenerate is a new version
    assert user.delete(f"/api/sessions/{sid}").status_code == 204
    sid = new_session(user)
    assert send(user, sid, "Hi").status_code == 200
    with user.stream("POST", f"/api/sessions/{sid}/regenerate") as regenerated:
        events = [json.loads(e["data"]) for e in sse_events(regenerated.iter_lines())]
    assert regenerated.status_code == 200 and events[-1]["type"] == "done"
    shown = user.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert len(shown) == 2 and len(shown[1]["sibling_ids"]) == 2


def test_text_past_the_owner_byte_limit_is_refused(client):
    user = browser(client)
    check_quota(user.post("/api/sessions", json={"system_prompt": "x" * 1001}), "max_bytes_per_owner", 1000)
    sid = new_session(user, title="", system_prompt="hello " * 100)  # 600 bytes
    check_quota(send(user, sid, "world " * 67), "max_bytes_per_owner", 1000)  # + 402 bytes
    check_quota(
        user.patch(f"/api/sessions/{sid}", json={"system_prompt": "z" * 1001}), "max_bytes_per_owner", 1000
    )
    assert user.get(f"/api/sessions/{sid}/messages").json()["messages"] == []
    assert user.patch(f"/api/sessions/{sid}", json={"system_prompt": "short"}).status_code == 200
    assert send(user, sid, "world " * 67).status_code == 200  # room again


def test_new_identities_are_rate_limited_per_address(client):
    address = next(_ADDRESSES)
    for _ in range(2):  # each a request without the cookie: a fresh owner every time
        assert browser(client, address).post("/api/sessions", json={}).status_code == 201
    refused = browser(client, address).post("/api/sessions", json={})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "identity_rate_limited"
    assert "at most 2 requests per minute without the browser cookie" in refused.json()["error"]["message"]
    assert "(new_identities_per_minute)" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    # a browser that keeps its cookie is not a new identity, and other addresses are not affected
    keeper = browser(client, address)
    keeper.get("/")  # the page hands out the cookie; loading it creates nothing
    assert BROWSER_COOKIE in keeper.cookies
    assert keeper.post("/api/sessions", json={}).status_code == 201
    assert browser(client).post("/api/sessions", json={}).status_code == 201


def test_api_key_owners_are_not_new_identities(tmp_path):
    with make_client(tmp_path, api_keys=("sk-quota",), new_identities_per_minute=1) as running:
        for _ in range(3):
            running.cookies.clear()  # no browser cookie: only the key says who this is
            response = running.post("/api/sessions", json={}, headers={"authorization": "Bearer sk-quota"})
            assert response.status_code == 201, response.text
        for expected in (201, 429):
            running.cookies.clear()
            assert running.post("/api/sessions", json={}).status_code == expected


def test_the_database_guard_answers_507_with_its_value(tmp_path):
    with make_client(tmp_path, max_database_bytes=4096) as guarded:
        response = guarded.post("/api/sessions", json={"title": "too much"})
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        assert (error["code"], error["type"]) == ("database_full", "insufficient_storage_error")
        assert "at its limit of 4096 bytes (max_database_bytes)" in error["message"]
        assert guarded.get("/api/sessions").json() == {"sessions": []}  # reads still work
        state, _ = guarded.portal.call(admin_feed(guarded.app).sample)  # the admin page's advice says so
        [database] = [item for item in state["advice"]["items"] if item["title"] == "Database full"]
        assert (database["level"], database["title"]) == ("warn", "Database full")
        assert (
            "of its guard of 4.0 KiB (max_database_bytes): new sessions and messages are refused"
            in database["text"]
        )

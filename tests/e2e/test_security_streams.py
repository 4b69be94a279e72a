"""Long-lived streams end once their credential does (issue #35, item 5), against a real `pagedchat serve --auth
local` re-checking every 0.2 s: the admin feed of an admin account that is demoted, disabled or deleted, the feed of
an admin cookie signed out, a chat socket idle or mid-reply (4401 after an error frame, the client sending nothing),
a reply over SSE and a streamed /v1 request; each running reply is stopped and its blocks go back to the pool."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from bench.common.servers import stop_server
from tests.app.factories import pool_is_idle
from tests.e2e.accounts_helpers import (
    ROOT,
    ROOT_PASSWORD,
    add_user,
    browser,
    signed_in,
    start_accounts_server,
)
from tests.e2e.conftest import Server

ADMIN_TOKEN = "streams-admin-token-0123456789"
CHECK_INTERVAL_S = 0.2
END_WITHIN_S = 15.0  # generous for two shared cores; the figure seen is about one interval (see the report)
LONG_REPLY = 900  # tokens: a reply still running when its credential goes


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    running = start_accounts_server(
        tmp_path_factory.mktemp("streams-server"),
        tiny_model,
        PAGEDCHAT_ADMIN_TOKEN=ADMIN_TOKEN,
        PAGEDCHAT_CREDENTIAL_CHECK_INTERVAL_S=str(CHECK_INTERVAL_S),
        PAGEDCHAT_MAX_MODEL_LEN="1024",
    )
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def root(server) -> Iterator[httpx.Client]:
    with signed_in(server, ROOT, ROOT_PASSWORD) as client:
        yield client


def revoke(root: httpx.Client, user_id: str, change: str) -> float:
    """Demote, disable or delete an account as the admin root; when it was done (time.monotonic())."""
    if change == "deleted":
        response = root.delete(f"/api/users/{user_id}")
    else:
        response = root.patch(
            f"/api/users/{user_id}", json={"role": "user"} if change == "demoted" else {"disabled": True}
        )
    assert response.status_code == 200, response.text
    return time.monotonic()


def wait_pool_idle(server: Server, timeout_s: float = 10.0) -> None:
    """Poll the admin state (with the admin token: loopback alone is no admin here) until the pool is idle."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(
            server.base_url + "/api/admin/state", headers={"x-admin-token": ADMIN_TOKEN}, timeout=10
        )
        assert response.status_code == 200, response.text
        state = response.json()
        if pool_is_idle(state):
            return
        assert time.monotonic() < deadline, f"pool not idle after {timeout_s} s: {state['stats']}"
        time.sleep(0.05)


class Events:
    """The SSE events of a streamed response, read one at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.iter_lines()
        self.seen: list[dict[str, Any]] = []

    def next(self) -> dict[str, Any] | None:
        """The next event ({"event"?, "data"}), None at the end of the stream."""
        event: dict[str, Any] = {}
        for line in self.lines:
            if not line:
                if "data" in event:
                    self.seen.append(event)
                    return event
                continue
            name, _, value = line.partition(":")
            if name in ("event", "data"):
                event[name] = value[1:] if value.startswith(" ") else value
        return None

    def until(self, wanted: str) -> dict[str, Any]:
        """Read up to the first event named `wanted` (or whose data contains it)."""
        while (event := self.next()) is not None:
            if event.get("event") == wanted or wanted in event["data"]:
                return event
        raise AssertionError(f"the stream ended before {wanted!r}: {self.seen[-3:]}")

    def until_end(self, since: float) -> list[dict[str, Any]]:
        """The events up to the end of the stream, which must come within END_WITHIN_S of `since`."""
        rest = []
        while (event := self.next()) is not None:
            rest.append(event)
            waited = time.monotonic() - since
            assert waited < END_WITHIN_S, f"the stream still runs {waited:.1f} s after its credential went"
        return rest


def stream_error(event: dict[str, Any]) -> dict[str, Any]:
    """The error an SSE event carries (`{"error": {...}}` of the API, or a chat socket's error frame)."""
    data = json.loads(event["data"])
    return data.get("error", data)


@pytest.mark.parametrize("change", ["demoted", "disabled", "deleted"])
def test_the_admin_feed_of_an_admin_account_ends_when_it_stops_being_one(server, root, change):
    frank_id = add_user(root, f"frank-{change}", role="admin")["id"]
    with signed_in(server, f"frank-{change}") as frank:
        with frank.stream("GET", "/api/admin/stream?history=0") as response:
            assert response.status_code == 200
            events = Events(response)
            events.until("state")  # live
            rest = events.until_end(since=revoke(root, frank_id, change))
        assert rest[-1]["event"] == "error" and stream_error(rest[-1])["code"] == "not_signed_in"
        assert frank.get("/api/admin/stream").status_code in (401, 403)  # the page's reconnect is refused


def test_the_admin_feed_of_an_admin_cookie_ends_at_its_sign_out(server):
    with browser(server) as admin:
        signed_in = admin.post("/admin/login", data={"token": ADMIN_TOKEN}, follow_redirects=False)
        assert signed_in.status_code == 303 and "pagedchat_admin" in admin.cookies
        cookie = admin.cookies["pagedchat_admin"]
        with admin.stream("GET", "/api/admin/stream?history=0") as response:
            assert response.status_code == 200
            events = Events(response)
            events.until("state")
            with browser(server) as other_tab:  # its own client: the feed's keeps reading
                other_tab.cookies.set("pagedchat_admin", cookie)
                assert other_tab.post("/admin/logout", follow_redirects=False).status_code == 303
            rest = events.until_end(since=time.monotonic())
        assert rest[-1]["event"] == "error" and stream_error(rest[-1])["code"] == "not_signed_in"


def new_session(client: httpx.Client) -> str:
    settings = {"temperature": 0, "max_tokens": LONG_REPLY}
    response = client.post("/api/sessions", json={"title": "Layoff plan", "settings": settings})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def open_socket(server: Server, client: httpx.Client, sid: str) -> Any:
    cookie = f"pagedchat_session={client.cookies['pagedchat_session']}"
    return connect(f"{server.ws_url}/ws/sessions/{sid}", additional_headers={"Cookie": cookie})


def stored_reply(server: Server, root: httpx.Client, user_id: str, username: str, sid: str) -> dict[str, Any]:
    """The last message of a disabled account's chat, read once an admin has enabled it again."""
    response = root.patch(f"/api/users/{user_id}", json={"disabled": False})
    assert response.status_code == 200, response.text
    with signed_in(server, username) as client:
        return client.get(f"/api/sessions/{sid}/messages").json()["messages"][-1]


def frames_until_closed(ws: Any, since: float) -> tuple[list[dict[str, Any]], int | None]:
    """The frames up to the socket's close, which must come within END_WITHIN_S of `since`; and the close code."""
    frames = []
    try:
        while True:
            frames.append(json.loads(ws.recv(timeout=max(0.1, since + END_WITHIN_S - time.monotonic()))))
    except TimeoutError:
        raise AssertionError(
            f"the socket is still open {END_WITHIN_S} s after its credential went: {frames[-3:]}"
        ) from None
    except ConnectionClosed as closed:
        return frames, closed.rcvd.code if closed.rcvd is not None else None


def test_a_chat_socket_mid_reply_closes_with_4401_when_its_account_is_disabled(server, root):
    user_id = add_user(root, "wes")["id"]
    with signed_in(server, "wes") as wes:
        sid = new_session(wes)
        with open_socket(server, wes, sid) as ws:
            ws.send(json.dumps({"type": "message", "content": "Tell me everything"}))
            while json.loads(ws.recv(timeout=30))["type"] != "delta":
                pass
            frames, code = frames_until_closed(ws, since=revoke(root, user_id, "disabled"))
    assert code == 4401
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == "not_signed_in"
    assert "done" not in [f["type"] for f in frames]  # cut mid-reply: it did not run to its end
    wait_pool_idle(server)
    reply = stored_reply(server, root, user_id, "wes", sid)
    assert reply["status"] == "interrupted" and reply["completion_tokens"] < LONG_REPLY


def test_an_idle_chat_socket_closes_with_4401_at_its_sign_out(server, root):
    add_user(root, "ida")
    with signed_in(server, "ida") as ida, open_socket(server, ida, new_session(ida)) as ws:
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv(timeout=30)) == {"type": "pong"}
        assert ida.post("/auth/logout").status_code == 204
        frames, code = frames_until_closed(ws, since=time.monotonic())
    assert code == 4401 and [(f["type"], f["code"]) for f in frames] == [("error", "not_signed_in")]


def test_a_reply_over_sse_ends_with_an_error_event_when_its_account_is_disabled(server, root):
    user_id = add_user(root, "sue")["id"]
    with signed_in(server, "sue") as sue:
        sid = new_session(sue)
        with sue.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Ramble on"}) as response:
            assert response.status_code == 200
            events = Events(response)
            events.until("delta")
            rest = events.until_end(since=revoke(root, user_id, "disabled"))
    assert rest[-1]["event"] == "error" and stream_error(rest[-1])["code"] == "not_signed_in"
    assert "done" not in [e.get("event") for e in rest]
    wait_pool_idle(server)
    reply = stored_reply(server, root, user_id, "sue", sid)
    assert reply["status"] == "interrupted" and reply["completion_tokens"] < LONG_REPLY


def test_a_streamed_v1_request_on_an_account_cookie_ends_when_the_account_is_disabled(server, root):
    user_id = add_user(root, "vic")["id"]
    body = {
        "messages": [{"role": "user", "content": "Count to a thousand"}],
        "max_tokens": LONG_REPLY,
        "ignore_eos": True,
        "stream": True,
    }
    with signed_in(server, "vic") as vic, vic.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = Events(response)
        events.until("delta")
        rest = events.until_end(since=revoke(root, user_id, "disabled"))
    assert [e["data"] for e in rest[-1:]] == ["[DONE]"]
    assert stream_error(rest[-2])["code"] == "not_signed_in"
    assert not any('"finish_reason":"length"' in e["data"].replace(" ", "") for e in rest)
    wait_pool_idle(server)

"""Invites and per-account API keys attacked on a real `pagedchat serve --auth local` (issue #35): an admin's invite
dies when the admin is demoted, disabled or deleted (the "eve-sock" attack); admins list and revoke pending invites;
an account makes, lists and revokes its keys; a key acts as its account (its chats, its prefix cache), stops at
once when revoked or its account disabled, ends its running streams when revoked, and wrong keys are throttled."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from app.http.login_throttle import ADDRESS
from bench.common.servers import stop_server
from tests.app.factories import pool_is_idle
from tests.e2e.accounts_helpers import (
    PASSWORD,
    ROOT,
    ROOT_PASSWORD,
    add_user,
    browser,
    signed_in,
    start_accounts_server,
)
from tests.e2e.conftest import Server

ADMIN_TOKEN = "keys-admin-token-3b9e"
SERVER_KEY = "team-key-7"  # a server-wide --api-key, as an operator might choose it: short, guessable
LONG = 900  # tokens a stream may run: long enough to be revoked mid-way on the tiny model
# a prompt of several full KV blocks (16 tokens each), so that a second request finds it in the prefix cache
PROMPT = "Tell me everything about the history of paged attention, block tables and prefix caching. " * 3


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    running = start_accounts_server(
        tmp_path_factory.mktemp("keys-server"),
        tiny_model,
        PAGEDCHAT_ADMIN_TOKEN=ADMIN_TOKEN,
        PAGEDCHAT_API_KEYS=SERVER_KEY,
        PAGEDCHAT_DEFAULT_MAX_TOKENS=str(LONG),
        PAGEDCHAT_MAX_MODEL_LEN="1024",
    )
    yield running
    stop_server(running)


def with_key(server: Server, key: str) -> httpx.Client:
    """A script's client: the key in its Authorization header, no cookie, no Origin."""
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture(scope="module")
def root(server) -> Iterator[httpx.Client]:
    with signed_in(server, ROOT, ROOT_PASSWORD) as client:
        yield client


def make_key(client: httpx.Client, name: str) -> dict[str, Any]:
    response = client.post("/api/keys", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()


def error_of(response: httpx.Response) -> tuple[int, str | None]:
    return response.status_code, response.json().get("error", {}).get("code")


def chat(client: httpx.Client, max_tokens: int = 1, **extra: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0}
    return client.post("/v1/chat/completions", json={**body, **extra})


def cached_tokens(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def wait_pool_idle(server: Server, timeout_s: float = 10.0) -> None:
    """Poll the admin state (with the admin token) until no block is in use and no sequence is live."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(server.base_url + "/api/admin/state", headers={"X-Admin-Token": ADMIN_TOKEN})
        assert response.status_code == 200, response.text
        if pool_is_idle(response.json()):
            return
        assert time.monotonic() < deadline, f"pool not idle after {timeout_s} s: {response.json()['stats']}"
        time.sleep(0.05)


def test_an_admins_invite_dies_when_the_admin_is_demoted_disabled_or_deleted(server, root):
    for change in ("demote", "disable", "delete"):
        eve = add_user(root, f"eve-{change}", role="admin")
        with signed_in(server, eve["username"]) as eve_browser:
            invite = eve_browser.post(
                "/api/users/invites", json={"username": f"sock-{change}", "role": "admin"}
            )
        assert invite.status_code == 201, invite.text
        token = invite.json()["path"].split("#", 1)[1]
        if change == "demote":
            done = root.patch(f"/api/users/{eve['id']}", json={"role": "user"})
        elif change == "disable":
            done = root.patch(f"/api/users/{eve['id']}", json={"disabled": True})
        else:
            done = root.delete(f"/api/users/{eve['id']}")
        assert done.status_code == 200, done.text
        with browser(server) as sock:
            assert error_of(sock.post("/auth/invite", json={"token": token})) == (404, "invite_not_found")
            accepted = sock.post("/auth/invite/accept", json={"token": token, "password": "sock password"})
            assert error_of(accepted) == (404, "invite_not_found"), (change, accepted.text)
            assert error_of(sock.get("/auth/me")) == (401, "not_signed_in")
    usernames = {u["username"] for u in root.get("/api/users").json()["users"]}
    assert not any(name.startswith("sock-") for name in usernames)


def test_admins_list_and_revoke_pending_invites(server, root):
    made = {}
    for name in ("ivy", "ian"):
        response = root.post("/api/users/invites", json={"username": name, "role": "user"})
        assert response.status_code == 201, response.text
        made[name] = response.json()
    listed = root.get("/api/users/invites")
    assert listed.status_code == 200, listed.text
    pending = {i["username"]: i for i in listed.json()["invites"]}
    assert set(pending) == {"ivy", "ian"}
    assert (pending["ivy"]["role"], pending["ivy"]["created_by"]) == ("user", ROOT)
    assert pending["ivy"]["id"] == made["ivy"]["id"]
    assert made["ivy"]["path"].split("#", 1)[1] not in listed.text  # the token is never listed
    with signed_in(server, add_user(root, "una")["username"]) as una:  # not an admin
        assert error_of(una.get("/api/users/invites")) == (403, "admin_account_required")
        assert error_of(una.delete(f"/api/users/invites/{pending['ivy']['id']}")) == (
            403,
            "admin_account_required",
        )
    revoked = root.delete(f"/api/users/invites/{pending['ivy']['id']}")
    assert revoked.status_code == 204, revoked.text
    assert error_of(root.delete(f"/api/users/invites/{pending['ivy']['id']}")) == (404, "not_found")
    assert [i["username"] for i in root.get("/api/users/invites").json()["invites"]] == ["ian"]
    with browser(server) as ivy, browser(server) as ian:
        ivy_token = made["ivy"]["path"].split("#", 1)[1]
        refused = ivy.post("/auth/invite/accept", json={"token": ivy_token, "password": "ivy password"})
        assert error_of(refused) == (404, "invite_not_found")
        ian_token = made["ian"]["path"].split("#", 1)[1]
        accepted = ian.post("/auth/invite/accept", json={"token": ian_token, "password": "ian password"})
        assert accepted.status_code == 201, accepted.text  # an invite of an admin who still is one works
    assert root.get("/api/users/invites").json()["invites"] == []  # used: no longer pending


def test_an_account_makes_lists_and_revokes_its_own_keys(server, root):
    add_user(root, "kim")
    add_user(root, "lee")
    with signed_in(server, "kim") as kim, signed_in(server, "lee") as lee:
        first = make_key(kim, "laptop")
        second = make_key(kim, "ci")
        assert first["key"].startswith("pck_") and first["prefix"] == first["key"][:12]
        listed = kim.get("/api/keys").json()["keys"]
        assert [(k["name"], k["prefix"]) for k in listed] == [
            ("laptop", first["prefix"]),
            ("ci", second["prefix"]),
        ]
        assert first["key"] not in json.dumps(listed)  # shown once, at creation
        assert lee.get("/api/keys").json()["keys"] == []
        assert error_of(lee.delete(f"/api/keys/{first['id']}")) == (404, "not_found")
        assert error_of(kim.post("/api/keys", json={"name": ""}))[0] == 400
        with with_key(server, first["key"]) as script:  # a key lists, makes and revokes no keys
            assert error_of(script.get("/api/keys")) == (403, "api_key_not_allowed")
            assert script.post("/api/keys", json={"name": "more"}).status_code == 403
            assert script.delete(f"/api/keys/{second['id']}").status_code == 403
        with browser(server) as stranger:
            assert error_of(stranger.get("/api/keys")) == (401, "not_signed_in")
        assert kim.delete(f"/api/keys/{first['id']}").json() == {"revoked": True, "ended": 0}
        assert [k["name"] for k in kim.get("/api/keys").json()["keys"]] == ["ci"]


def test_a_key_acts_as_its_account_for_chats_and_the_prefix_cache(server, root):
    add_user(root, "max")
    add_user(root, "ned")
    with signed_in(server, "max") as max_browser, signed_in(server, "ned") as ned_browser:
        max_key = make_key(max_browser, "script")["key"]
        ned_key = make_key(ned_browser, "script")["key"]
        with with_key(server, max_key) as script:
            made = script.post(
                "/api/sessions", json={"title": "made by a script"}
            )  # no Origin: no CSRF check
            assert made.status_code == 201, made.text
            assert [s["title"] for s in max_browser.get("/api/sessions").json()["sessions"]] == [
                "made by a script"
            ]
            assert ned_browser.get("/api/sessions").json()["sessions"] == []
            assert script.get(f"/api/sessions/{made.json()['id']}").status_code == 200
            # the prefix cache is the account's: what its browser cached, its key reuses; another account's not
            # (beyond the public head of the template that every caller shares)
            assert chat(max_browser).status_code == 200
            by_key = cached_tokens(chat(script))
            assert script.get("/v1/models").status_code == 200
        by_browser = cached_tokens(chat(max_browser))
        with with_key(server, ned_key) as other:
            by_other = cached_tokens(chat(other))
        assert by_key == by_browser and by_other < by_key, (by_key, by_browser, by_other)


def test_a_revoked_key_or_a_disabled_accounts_key_gets_401_at_once(server, root):
    ola = add_user(root, "ola")
    with signed_in(server, "ola") as ola_browser:
        revoked = make_key(ola_browser, "old")
        kept = make_key(ola_browser, "kept")
        ola_browser.delete(f"/api/keys/{revoked['id']}")
    with with_key(server, revoked["key"]) as script:
        assert error_of(chat(script)) == (401, "api_key_revoked")
        assert error_of(script.get("/api/sessions")) == (401, "api_key_revoked")
    with with_key(server, kept["key"]) as script:
        assert chat(script).status_code == 200
        assert root.patch(f"/api/users/{ola['id']}", json={"disabled": True}).status_code == 200
        assert error_of(chat(script))[0] == 401
        assert error_of(script.get("/api/sessions"))[0] == 401
        assert root.patch(f"/api/users/{ola['id']}", json={"disabled": False}).status_code == 200
        assert error_of(chat(script)) == (401, "api_key_revoked")  # disabling revoked it for good


def test_a_password_change_revokes_a_key_made_with_a_stolen_cookie(server, root):
    """A thief with a copy of tom's session cookie makes a key; tom changes his password, the README's remedy that
    makes the copy worthless. Merged, the key kept working (200): the stolen cookie became a lasting credential."""
    add_user(root, "tom")
    with signed_in(server, "tom") as tom, browser(server) as thief:
        thief.cookies.set("pagedchat_session", tom.cookies["pagedchat_session"])
        stolen = make_key(thief, "mine")["key"]
        own = make_key(tom, "own")["key"]
        changed = tom.post(
            "/auth/password", json={"current_password": PASSWORD, "new_password": "a new password 2"}
        )
        assert changed.status_code == 200, changed.text
        assert error_of(thief.get("/api/keys")) == (401, "not_signed_in")
        for key in (stolen, own):
            with with_key(server, key) as script:
                assert error_of(script.get("/api/sessions")) == (401, "api_key_revoked")
        assert tom.get("/api/keys").json()["keys"] == []  # his new sign-in makes new ones
        assert make_key(tom, "new")["key"].startswith("pck_")


def test_revoking_a_key_ends_its_running_streams(server, root):
    add_user(root, "pia")
    with signed_in(server, "pia") as pia, httpx.Client(base_url=server.base_url, timeout=60) as script:
        key = make_key(pia, "long")
        auth = {"Authorization": f"Bearer {key['key']}"}
        session = script.post("/api/sessions", json={"title": "long"}, headers=auth).json()
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": LONG, "ignore_eos": True}
        with (
            script.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers=auth) as api,
            script.stream(
                "POST", f"/api/sessions/{session['id']}/messages", json={"content": "hi"}, headers=auth
            ) as reply,
        ):
            assert (api.status_code, reply.status_code) == (200, 200)
            api_lines, reply_lines = api.iter_lines(), reply.iter_lines()
            next(line for line in api_lines if '"content"' in line)  # both are generating
            next(line for line in reply_lines if line == "event: delta")
            revoked_at = time.monotonic()
            revoked = pia.delete(f"/api/keys/{key['id']}")
            assert revoked.json() == {"revoked": True, "ended": 2}, revoked.text
            api_rest = [line for line in api_lines if line.startswith("data: ")]
            reply_rest = [line for line in reply_lines if line.startswith("data: ")]
            ended_s = time.monotonic() - revoked_at
        assert api_rest[-1] == "data: [DONE]"
        assert json.loads(api_rest[-2].removeprefix("data: "))["error"]["code"] == "api_key_revoked"
        done = json.loads(reply_rest[-1].removeprefix("data: "))
        assert (done["type"], done["reason"], done["message"]["status"]) == (
            "done",
            "api_key_revoked",
            "interrupted",
        )
        assert done["usage"]["completion_tokens"] < LONG
        print(f"both streams ended {ended_s:.2f} s after the revocation")
        wait_pool_idle(server)
        stored = pia.get(f"/api/sessions/{session['id']}/messages").json()["messages"]
        assert [m["status"] for m in stored] == ["complete", "interrupted"]


def test_revoking_a_key_stops_its_chat_socket(server, root):
    add_user(root, "rex")
    with signed_in(server, "rex") as rex:
        key = make_key(rex, "socket")
        auth = {"Authorization": f"Bearer {key['key']}"}
        session = httpx.post(server.base_url + "/api/sessions", json={"title": "ws"}, headers=auth).json()
        with connect(f"{server.ws_url}/ws/sessions/{session['id']}", additional_headers=auth) as ws:
            ws.send(json.dumps({"type": "message", "content": "hi"}))
            while json.loads(ws.recv(timeout=30))["type"] != "delta":
                pass
            assert rex.delete(f"/api/keys/{key['id']}").json() == {"revoked": True, "ended": 1}
            while (frame := json.loads(ws.recv(timeout=30)))["type"] != "done":
                pass
            assert (frame["reason"], frame["message"]["status"]) == ("api_key_revoked", "interrupted")
            ws.send(json.dumps({"type": "message", "content": "again"}))  # the socket's next turn is refused
            refused = json.loads(ws.recv(timeout=30))
            assert (refused["status"], refused["code"]) == (401, "not_signed_in")
            assert "a revoked key" in refused["message"]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
            assert ws.close_code == 4401
    wait_pool_idle(server)


def test_a_scripts_concurrent_requests_with_its_right_key_all_get_in(server, root):
    """A script (an OpenAI client with a pool of connections) sends 20 requests at once with its right key: every
    one is served. Merged, a key's lookup reserved a password attempt, and past 5 in flight the address had to wait:
    15 of the 20 got 429 `too_many_attempts` ("too many wrong usernames or passwords") with no wrong secret sent."""
    add_user(root, "ray")
    with signed_in(server, "ray") as ray:
        key = make_key(ray, "pool")["key"]
    num = 20
    start = threading.Barrier(num)
    with httpx.Client(
        base_url=server.base_url,
        headers={"Authorization": f"Bearer {key}"},
        limits=httpx.Limits(max_connections=num),
        timeout=30,
    ) as script:

        def call() -> httpx.Response:
            start.wait()
            return script.get("/api/sessions")

        with ThreadPoolExecutor(num) as pool:
            statuses = [r.status_code for r in pool.map(lambda _: call(), range(num))]
    assert statuses == [200] * num, statuses


def test_guesses_at_a_server_wide_key_are_throttled_per_address(server, root):
    """Guessing the operator's server-wide --api-key (`team-key-0`, `team-key-1`, ...) from one address: merged,
    every guess got 401 at full speed, however many. Now the 6th is refused (429) and, while the address waits,
    even the right key; another address is not held back."""
    guesser = httpx.HTTPTransport(local_address="127.0.0.7")
    statuses = []
    for i in range(8):
        with httpx.Client(
            base_url=server.base_url, transport=guesser, headers={"Authorization": f"Bearer team-key-{i}"}
        ) as client:
            statuses.append(error_of(client.get("/v1/models")))
    free = ADDRESS.free_failures
    assert statuses == [(401, "invalid_api_key")] * free + [(429, "too_many_attempts")] * (8 - free), statuses
    with httpx.Client(
        base_url=server.base_url, transport=guesser, headers={"Authorization": f"Bearer {SERVER_KEY}"}
    ) as client:
        assert error_of(client.get("/v1/models")) == (429, "too_many_attempts")
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {SERVER_KEY}"}) as client:
        assert client.get("/v1/models").status_code == 200


def test_wrong_keys_are_throttled_per_address(server, root):
    """Last in the module: it leaves 127.0.0.1 waiting."""
    add_user(root, "quinn")
    with signed_in(server, "quinn") as quinn:  # signed in before the address has to wait
        statuses = []
        for i in range(8):
            with with_key(server, f"pck_{i:02d}" + "x" * 41) as guesser:
                response = guesser.get("/api/sessions")
            statuses.append(error_of(response))
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                break
        assert statuses[-1] == (429, "too_many_attempts"), statuses
        assert statuses[:-1] == [(401, "invalid_api_key")] * (len(statuses) - 1), statuses
        assert len(statuses) - 1 >= ADDRESS.free_failures, statuses  # the free failures first
        right = make_key(quinn, "right")["key"]
    with with_key(server, right) as script:  # while the address waits, even a right key is not looked up
        assert error_of(script.get("/api/sessions")) == (429, "too_many_attempts")

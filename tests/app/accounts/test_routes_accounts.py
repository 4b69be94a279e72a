"""Accounts over HTTP (`--auth local`) on the real tiny engine: the 401s and the redirect to sign-in, sign-in and
sign-out (revoked on the server), wrong passwords throttled, chats per account across devices and hidden from other
accounts, the admin's accounts and invites, and a deleted account's chats and cached blocks gone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from app.http.identity import account_owner
from engine.core.hash_chain import salt_tag
from engine.tiers.block_file import BlockName
from tests.app.factories import make_client, pool_state
from tests.reliability.helpers import peer, session_events

ADMIN, ADMIN_PASSWORD = "root", "root password 1"
CHAT = {"settings": {"temperature": 0, "max_tokens": 2}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("accounts"),
        auth="local",
        first_admin=ADMIN,
        first_admin_password=ADMIN_PASSWORD,
    ) as c:
        yield c


def device(client: TestClient, address: str = "127.0.0.1") -> TestClient:
    """A new browser (its own cookie jar) on the running app, connecting from `address`."""
    return peer(client, client=(address, 50000))


def sign_in(client: TestClient, username: str, password: str, address: str = "127.0.0.1") -> TestClient:
    browser = device(client, address)
    response = browser.post("/auth/login", json={"username": username, "password": password})
    assert response.status_code == 200, response.text
    return browser


@pytest.fixture(scope="module")
def admin(client) -> TestClient:
    return sign_in(client, ADMIN, ADMIN_PASSWORD)


def add_user(admin: TestClient, username: str, password: str = "a password 1", role: str = "user") -> dict:
    response = admin.post("/api/users", json={"username": username, "password": password, "role": role})
    assert response.status_code == 201, response.text
    return response.json()["user"]


def error_of(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_without_a_sign_in_pages_redirect_and_the_apis_say_401(client):
    stranger = device(client)
    page = stranger.get("/", follow_redirects=False)
    assert (page.status_code, page.headers["location"]) == (303, "/login")
    assert "pagedchat_browser" not in page.headers.get("set-cookie", "")  # no browser identity is handed out
    login = stranger.get("/login")
    assert login.status_code == 200 and 'id="login-form"' in login.text
    assert stranger.get("/account", follow_redirects=False).headers["location"] == "/login?next=/account"
    listing = stranger.get("/api/sessions")
    assert error_of(listing) == (401, "not_signed_in")
    assert "sign in at /login" in listing.json()["error"]["message"]
    v1 = stranger.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert error_of(v1) == (401, "not_signed_in")
    assert error_of(stranger.get("/auth/me")) == (401, "not_signed_in")
    with stranger.websocket_connect("/ws/sessions/anything") as ws:
        frame = ws.receive_json()
        assert (frame["status"], frame["code"]) == (401, "not_signed_in")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 4401


def test_sign_in_sets_an_httponly_cookie_and_sign_out_revokes_it_on_the_server(client):
    browser = device(client)
    response = browser.post(
        "/auth/login", json={"username": "ROOT ", "password": ADMIN_PASSWORD, "next": "/x"}
    )
    assert response.status_code == 200, response.text
    assert (response.json()["user"]["username"], response.json()["next"]) == ("root", "/x")
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("pagedchat_session=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    secret = browser.cookies["pagedchat_session"]
    assert browser.get("/auth/me").json()["user"]["role"] == "admin"
    assert browser.get("/").status_code == 200
    assert browser.get("/login", follow_redirects=False).headers["location"] == "/"
    assert browser.post("/auth/logout").status_code == 204
    copy = device(client)
    copy.cookies.set("pagedchat_session", secret)  # a stolen copy of the cookie is worthless now
    assert error_of(copy.get("/api/sessions")) == (401, "not_signed_in")
    # a login from another site would sign the victim's browser into the attacker's account
    cross = device(client).post(
        "/auth/login",
        json={"username": ADMIN, "password": ADMIN_PASSWORD},
        headers={"origin": "http://evil.example"},
    )
    assert error_of(cross) == (403, "cross_origin_request")
    elsewhere = {"username": ADMIN, "password": ADMIN_PASSWORD, "next": "//evil.example"}
    assert browser.post("/auth/login", json=elsewhere).json()["next"] == "/"  # no open redirect


def test_wrong_passwords_are_refused_then_throttled_per_address(client):
    # an unknown name gets the same answer as a wrong password
    unknown = device(client, "203.0.113.6").post("/auth/login", json={"username": "nobody", "password": "x"})
    assert unknown.json()["error"]["message"] == "wrong username or password"
    guesser = device(client, "203.0.113.5")
    for _ in range(5):
        response = guesser.post("/auth/login", json={"username": ADMIN, "password": "guess"})
        assert error_of(response) == (401, "invalid_credentials")
        assert response.json()["error"]["message"] == "wrong username or password"
    throttled = guesser.post("/auth/login", json={"username": ADMIN, "password": ADMIN_PASSWORD})
    assert error_of(throttled) == (429, "too_many_attempts")
    message = throttled.json()["error"]["message"]
    assert message == "too many wrong usernames or passwords from this address: retry in 1 s"
    assert throttled.headers["retry-after"] == "1"
    time.sleep(1.05)
    assert (
        guesser.post("/auth/login", json={"username": ADMIN, "password": ADMIN_PASSWORD}).status_code == 200
    )


def test_chats_follow_the_account_across_devices_and_stay_hidden_from_others(client, admin):
    add_user(admin, "ann", "ann password")
    add_user(admin, "ben", "ben password")
    laptop, phone = sign_in(client, "ann", "ann password"), sign_in(client, "ann", "ann password")
    other = sign_in(client, "ben", "ben password")
    sid = laptop.post("/api/sessions", json={"title": "plans", **CHAT}).json()["id"]
    session_events(laptop, sid, "hello from the laptop")
    assert [s["id"] for s in phone.get("/api/sessions").json()["sessions"]] == [sid]
    messages = phone.get(f"/api/sessions/{sid}").json()["messages"]
    assert messages[0]["content"] == "hello from the laptop" and messages[1]["role"] == "assistant"
    assert other.get("/api/sessions").json()["sessions"] == []
    assert error_of(other.get(f"/api/sessions/{sid}")) == (404, "not_found")
    assert error_of(other.delete(f"/api/sessions/{sid}")) == (404, "not_found")
    with other.websocket_connect(f"/ws/sessions/{sid}") as ws:
        assert ws.receive_json()["status"] == 404
    # the phone's socket writes to the same chat
    with phone.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": "and from the phone"})
        while ws.receive_json()["type"] != "done":
            pass
    contents = [
        m["content"] for m in laptop.get(f"/api/sessions/{sid}").json()["messages"] if m["role"] == "user"
    ]
    assert contents == ["hello from the laptop", "and from the phone"]


def test_a_password_change_signs_out_the_other_devices_and_their_sockets(client, admin):
    add_user(admin, "cat", "cat password")
    laptop, phone = sign_in(client, "cat", "cat password"), sign_in(client, "cat", "cat password")
    sid = phone.post("/api/sessions", json=CHAT).json()["id"]
    with phone.websocket_connect(f"/ws/sessions/{sid}") as ws:
        changed = laptop.post(
            "/auth/password", json={"current_password": "cat password", "new_password": "cat password 2"}
        )
        assert changed.status_code == 200, changed.text
        ws.send_json({"type": "message", "content": "still here?"})
        frame = ws.receive_json()
        assert (frame["type"], frame["code"]) == ("error", "not_signed_in")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 4401
    assert error_of(phone.get("/api/sessions")) == (401, "not_signed_in")
    assert laptop.get("/api/sessions").status_code == 200  # the device that changed it got a new sign-in
    wrong = laptop.post("/auth/password", json={"current_password": "nope", "new_password": "whatever 12"})
    assert error_of(wrong) == (403, "invalid_credentials")


def test_only_admins_manage_accounts_and_invites_work_once(client, admin):
    add_user(admin, "dan", "dan password")
    dan = sign_in(client, "dan", "dan password")
    assert error_of(dan.get("/api/users")) == (403, "admin_account_required")
    assert error_of(dan.post("/api/users/invites", json={"username": "eve"})) == (
        403,
        "admin_account_required",
    )
    assert error_of(admin.post("/api/users", json={"username": "dan", "password": "12345678"})) == (
        409,
        "account_conflict",
    )
    bad = admin.post("/api/users", json={"username": "x y", "password": "12345678"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "username"
    short = admin.post("/api/users", json={"username": "fay", "password": "short"})
    assert short.json()["error"]["message"] == "password must be 8 to 1024 characters, got 5"
    invite = admin.post("/api/users/invites", json={"username": "eve", "role": "user"}).json()
    assert invite["path"].startswith("/invite#") and invite["url"].endswith(invite["path"])
    token = invite["path"].split("#", 1)[1]
    invitee = device(client)
    assert invitee.get("/invite").status_code == 200
    assert invitee.post("/auth/invite", json={"token": token}).json()["username"] == "eve"
    accepted = invitee.post("/auth/invite/accept", json={"token": token, "password": "eve password"})
    assert accepted.status_code == 201, accepted.text
    assert invitee.get("/auth/me").json()["user"]["username"] == "eve"  # signed in at once
    again = device(client).post("/auth/invite/accept", json={"token": token, "password": "mallory pw"})
    assert error_of(again) == (404, "invite_not_found")
    sign_in(client, "eve", "eve password")
    users = {u["username"]: u for u in admin.get("/api/users").json()["users"]}
    disabled = admin.patch(f"/api/users/{users['dan']['id']}", json={"disabled": True})
    assert disabled.json()["user"]["disabled"] is True
    assert error_of(dan.get("/api/sessions")) == (401, "not_signed_in")  # disabling ended its sign-ins
    refused = device(client).post("/auth/login", json={"username": "dan", "password": "dan password"})
    assert error_of(refused) == (403, "account_disabled")
    last = admin.patch(f"/api/users/{users[ADMIN]['id']}", json={"role": "user"})
    assert error_of(last) == (409, "account_conflict")


def tier_files(admin: TestClient, tier_dir: Path, owner: str) -> list[str]:
    """The disk tier's block files under an owner's salt, once the tier has written its queue (the pool read by an
    admin account: with accounts on, loopback is no admin)."""
    deadline = time.monotonic() + 10
    while pool_state(admin)["stats"]["tier"]["write_queue_depth"] or pool_state(admin)["sequences"]:
        assert time.monotonic() < deadline, "the disk tier did not write its queue"
        time.sleep(0.02)
    tag = salt_tag(owner)
    return sorted(
        p.name for p in tier_dir.glob("*.kvb") if (n := BlockName.parse(p.name)) and n.salt_tag == tag
    )


def test_deleting_an_account_deletes_its_chats_and_purges_its_cached_blocks(client, admin):
    gus, hal = add_user(admin, "gus", "gus password"), add_user(admin, "hal", "hal password")
    gus_browser, hal_browser = sign_in(client, "gus", "gus password"), sign_in(client, "hal", "hal password")
    system = "You are the assistant of the dental clinic on Elm Street. " * 4
    for browser in (gus_browser, hal_browser):
        sid = browser.post("/api/sessions", json={"system_prompt": system, **CHAT}).json()["id"]
        session_events(browser, sid, "When are you open?")
    tier_dir = Path(client.app.state.services.settings.engine_config().kv_disk_dir)
    gus_files = tier_files(admin, tier_dir, account_owner(gus["id"]))
    hal_files = tier_files(admin, tier_dir, account_owner(hal["id"]))
    assert len(gus_files) >= 4 and len(hal_files) == len(gus_files)  # the same prompt: per-account blocks
    deleted = admin.delete(f"/api/users/{gus['id']}")
    assert deleted.status_code == 200, deleted.text
    # in the RAM pool as on disk: the same blocks (the pool is far from full, nothing was evicted)
    assert deleted.json() == {
        "deleted": True,
        "purged_ram_blocks": len(gus_files),
        "purged_disk_blocks": len(gus_files),
    }
    assert tier_files(admin, tier_dir, account_owner(gus["id"])) == []
    assert tier_files(admin, tier_dir, account_owner(hal["id"])) == hal_files
    assert error_of(gus_browser.get("/api/sessions")) == (401, "not_signed_in")
    store = client.app.state.services.store
    assert client.portal.call(store.chats.list_sessions, account_owner(gus["id"])) == []
    assert len(client.portal.call(store.chats.list_sessions, account_owner(hal["id"]))) == 1
    assert error_of(admin.delete(f"/api/users/{gus['id']}")) == (404, "not_found")


def test_an_admin_account_is_an_admin_of_the_engine_from_anywhere(client, admin):
    remote = (
        "203.0.113.9"  # no admin token is set: with accounts on, the admin surface is for admin accounts only
    )
    add_user(admin, "eve-user", "eve's password 1")
    add_user(admin, "ada-admin", "ada's password 1", role="admin")
    for address in (remote, "127.0.0.1"):  # loopback is no admin either
        assert error_of(device(client, address).get("/api/admin/state")) == (401, "admin_account_required")
        eve = sign_in(client, "eve-user", "eve's password 1", address)
        assert error_of(eve.get("/api/admin/state")) == (403, "admin_account_required")
    ada = sign_in(client, "ada-admin", "ada's password 1", remote)
    state = ada.get("/api/admin/state")
    assert state.status_code == 200, state.text
    assert state.json()["num_blocks"] > 0
    page = ada.get("/admin")
    assert page.status_code == 200 and 'id="block-map"' in page.text
    ada.post("/auth/logout")
    assert ada.get("/api/admin/state").status_code == 401  # signed out: no admin

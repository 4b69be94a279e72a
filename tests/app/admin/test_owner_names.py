"""The admin feed names who a running request is for: an account by its username, a per-account API key by the
key's name too (not 'account yY0KDskj'), anonymous browsers as such."""

from __future__ import annotations

import pytest

from app.admin.feed import admin_feed
from tests.app.factories import make_client
from tests.reliability.helpers import peer

ADMIN, ADMIN_PASSWORD = "root", "root password 1"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("names"), auth="local", first_admin=ADMIN, first_admin_password=ADMIN_PASSWORD
    ) as c:
        yield c


def sign_in(client, username: str, password: str):
    browser = peer(client, client=("127.0.0.1", 50000))
    response = browser.post("/auth/login", json={"username": username, "password": password})
    assert response.status_code == 200, response.text
    return browser


def feed_labels_while_running(client, caller, headers: dict[str, str] | None = None) -> list[dict]:
    """The admin feed's labels of the live sequences while one streamed /v1 request of `caller` runs."""
    body = {"messages": HELLO, "max_tokens": 250, "temperature": 0, "stream": True}
    with caller.stream("POST", "/v1/chat/completions", json=body, headers=headers or {}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        state, _ = client.portal.call(admin_feed(client.app).sample)
        for _ in lines:
            pass
    return [seq["label"] for seq in state["pool"]["sequences"]]


def test_the_feed_names_the_account_and_its_key(client):
    admin = sign_in(client, ADMIN, ADMIN_PASSWORD)
    made = admin.post("/api/users", json={"username": "alice", "password": "a password 1", "role": "user"})
    assert made.status_code == 201, made.text
    alice = sign_in(client, "alice", "a password 1")
    key = alice.post("/api/keys", json={"name": "laptop"})
    assert key.status_code == 201, key.text

    [by_key] = feed_labels_while_running(client, client, {"authorization": "Bearer " + key.json()["key"]})
    assert by_key == {"source": "api", "title": "chat completion", "owner": 'alice, API key "laptop"'}
    [by_cookie] = feed_labels_while_running(client, alice)
    assert by_cookie == {"source": "api", "title": "chat completion", "owner": "alice"}

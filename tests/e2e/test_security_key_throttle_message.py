"""Wrong API keys share the password throttle per address (one counter: guessing either is slowed alike), and the
429 names what was wrong: it used to say "too many wrong usernames or passwords" to a client that had sent only
wrong API keys. Against a real server with accounts and a server-wide key, each guesser on an address of its own."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from bench.common.servers import stop_server
from tests.e2e.accounts_helpers import ROOT, start_accounts_server
from tests.e2e.conftest import Server

SERVER_KEY = "team-key-7"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    running = start_accounts_server(
        tmp_path_factory.mktemp("key-throttle"), tiny_model, PAGEDCHAT_API_KEYS=SERVER_KEY
    )
    yield running
    stop_server(running)


def client_from(server: Server, address: str, **headers: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    headers = {"Origin": server.base_url, **headers}
    return httpx.Client(base_url=server.base_url, transport=transport, headers=headers, timeout=30)


def wrong_key(server: Server, address: str, key: str, path: str) -> httpx.Response:
    with client_from(server, address, Authorization=f"Bearer {key}") as client:
        return client.get(path)


def wrong_password(server: Server, address: str) -> httpx.Response:
    with client_from(server, address) as client:
        return client.post("/auth/login", json={"username": ROOT, "password": "not the password"})


def refusal(response: httpx.Response) -> str:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "too_many_attempts"
    return response.json()["error"]["message"]


def test_wrong_server_wide_and_account_keys_are_named_in_the_429(server):
    address = "127.0.0.21"
    for i in range(5):  # the free failures: a guessed server-wide key, then account keys
        path, key = ("/v1/models", f"team-key-{i}") if i < 3 else ("/api/sessions", f"pck_{i:02d}" + "x" * 41)
        assert wrong_key(server, address, key, path).status_code == 401
    message = refusal(wrong_key(server, address, "team-key-9", "/v1/models"))
    assert message.startswith("too many wrong API keys from this address: retry in "), message
    assert "password" not in message


def test_wrong_passwords_alone_keep_their_message_and_a_mix_names_both(server):
    passwords = "127.0.0.22"
    for _ in range(5):
        assert wrong_password(server, passwords).status_code == 401
    message = refusal(wrong_password(server, passwords))
    assert message.startswith("too many wrong usernames or passwords from this address: retry in "), message

    mixed = "127.0.0.23"
    for _ in range(3):
        assert wrong_password(server, mixed).status_code == 401
    for i in range(2):
        assert wrong_key(server, mixed, f"team-key-{i}", "/v1/models").status_code == 401
    message = refusal(wrong_key(server, mixed, "team-key-8", "/v1/models"))
    expected = "too many wrong usernames or passwords and wrong API keys from this address: retry in "
    assert message.startswith(expected), message
    assert refusal(wrong_password(server, mixed)).startswith(expected)  # one counter: either is refused

"""The CSRF check of cookie writes and the WebSocket handshake's Origin check are one rule: an origin passes both
or neither. They disagreed: the socket matched PAGEDCHAT_ALLOWED_ORIGINS as exact strings (an allowed origin written
with a capital or a trailing slash refused every socket while its writes passed) and compared only host and port
with Host (a page of another scheme opened sockets its writes could not make). Against a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from bench.common.servers import stop_server
from tests.e2e.conftest import Server, server_env, start_server

ALLOWED_AS_WRITTEN = (
    "HTTPS://Chat.Example.com/"  # what an operator may write; browsers send the lower-case origin
)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("origins")
    running = start_server(
        tmp_path, server_env(tmp_path, tiny_model, PAGEDCHAT_ALLOWED_ORIGINS=ALLOWED_AS_WRITTEN)
    )
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def own_session(server) -> tuple[httpx.Cookies, str]:
    """A browser cookie and a chat of it, made from the server's own page."""
    with httpx.Client(base_url=server.base_url, headers={"Origin": server.base_url}, timeout=30) as client:
        response = client.post("/api/sessions", json={})
        assert response.status_code == 201, response.text
        return client.cookies, response.json()["id"]


def cookie_write_status(server: Server, cookies: httpx.Cookies, origin: str) -> int:
    with httpx.Client(
        base_url=server.base_url, cookies=cookies, headers={"Origin": origin}, timeout=30
    ) as client:
        return client.post("/api/sessions", json={}).status_code


def socket_status(server: Server, cookies: httpx.Cookies, session_id: str, origin: str) -> int:
    header = {"Cookie": f"pagedchat_browser={cookies['pagedchat_browser']}"}
    try:
        with connect(
            f"{server.ws_url}/ws/sessions/{session_id}", origin=origin, additional_headers=header
        ) as ws:
            ws.send(json.dumps({"type": "ping"}))
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://chat.example.com", True),  # the allowed origin, as browsers send it
        ("https://chat.example.com:443", True),  # its default port spelled out
        ("http://chat.example.com", False),  # the allowed host under another scheme
        ("https://evil.example.com", False),
        ("own-origin-https", False),  # this server's host and port under https: not the server's own origin
        ("own-origin", True),
    ],
)
def test_an_origin_passes_the_cookie_write_and_the_websocket_alike(server, own_session, origin, allowed):
    cookies, session_id = own_session
    if origin.startswith("own-origin"):
        origin = (
            server.base_url.replace("http://", "https://") if origin.endswith("https") else server.base_url
        )
    write, socket = (
        cookie_write_status(server, cookies, origin),
        socket_status(server, cookies, session_id, origin),
    )
    assert (write, socket) == ((201, 101) if allowed else (403, 403)), origin

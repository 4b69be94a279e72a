"""Attacks that live below ASGI or across restarts, against real servers on 127.0.0.1 (bounded counts and time):
slowloris connections are closed after the request-head timeout, one address cannot hold more than its share of
connections, admin sign-outs and token changes stay in force across restarts, and a short admin token is refused."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import httpx
import pytest
from websockets.sync.client import connect

from bench.common.servers import stop_server
from tests.app.factories import make_tiny_model_dir
from tests.e2e.conftest import Server, server_env, start_server

HEADER_TIMEOUT_S = 3
MAX_CONNECTIONS = 60
NUM_SLOWLORIS = 50


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return str(make_tiny_model_dir())


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_model):
    tmp_path = tmp_path_factory.mktemp("guarded")
    env = server_env(
        tmp_path,
        tiny_model,
        PAGEDCHAT_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        PAGEDCHAT_CLIENT_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
    )
    server = start_server(tmp_path, env)
    yield server
    stop_server(server)


def open_socket(server: Server, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0))
    sock.settimeout(10)
    return sock


def read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_slowloris_connections_are_closed_after_the_head_timeout(guarded):
    slow = [open_socket(guarded) for _ in range(NUM_SLOWLORIS)]
    silent = open_socket(guarded)  # connects and sends nothing at all
    for sock in slow:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    began = time.monotonic()
    served = False
    while time.monotonic() - began < HEADER_TIMEOUT_S - 1:
        for sock in slow:
            sock.sendall(b"X-Drip: 1\r\n")  # one header line at a time, never the blank line
        if not served:  # the server still answers everyone else meanwhile
            served = httpx.get(guarded.base_url + "/health", timeout=5).status_code == 200
        time.sleep(0.5)
    assert served
    for sock in [*slow, silent]:
        assert (
            read_to_eof(sock)
            == b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        )
        sock.close()
    assert time.monotonic() - began < HEADER_TIMEOUT_S + 5
    # a kept-alive connection whose next request head trickles in is closed too
    kept = open_socket(guarded)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    first = b""
    while not first.endswith(b'"database":"ok"}'):  # the whole first response, headers and body
        first += kept.recv(4096)
    assert first.startswith(b"HTTP/1.1 200")
    kept.sendall(b"GET /health HTTP/1.1\r\n")
    assert read_to_eof(kept).startswith(b"HTTP/1.1 408")
    kept.close()
    assert "no request head in 3 s" in guarded.log()


def test_one_address_cannot_hold_more_than_its_connections(guarded):
    http = httpx.Client(base_url=guarded.base_url, timeout=10, headers={"Origin": guarded.base_url})
    http.get("/")
    sid = http.post("/api/sessions").json()["id"]
    cookie = {"Cookie": f"pagedchat_browser={http.cookies['pagedchat_browser']}"}
    http.close()
    for _ in range(MAX_CONNECTIONS + 10):  # sockets give their slot back when they close
        with connect(f"{guarded.ws_url}/ws/sessions/{sid}", additional_headers=cookie) as ws:
            ws.send(json.dumps({"type": "ping"}))
            assert json.loads(ws.recv(timeout=10)) == {"type": "pong"}
    with connect(f"{guarded.ws_url}/ws/sessions/{sid}", additional_headers=cookie) as held_socket:
        held = [open_socket(guarded) for _ in range(MAX_CONNECTIONS - 1)]  # with the socket: the limit
        refused = open_socket(guarded)
        assert read_to_eof(refused).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        with contextlib.suppress(httpx.TransportError):  # the refusal, if read before the server closed
            assert httpx.get(guarded.base_url + "/health", timeout=5).status_code == 503
        other = open_socket(guarded, source="127.0.0.2")  # another address has its own share
        other.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert read_to_eof(other).startswith(b"HTTP/1.1 200")
        held_socket.send(json.dumps({"type": "ping"}))
        assert json.loads(held_socket.recv(timeout=10)) == {"type": "pong"}  # held past the head timeout
        for sock in [refused, other, *held]:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the slots come back as the server sees the sockets close
        try:
            assert httpx.get(guarded.base_url + "/health", timeout=5).status_code == 200
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert "refused a connection from 127.0.0.1" in guarded.log()


def sign_in(server: Server, token: str) -> str:
    response = httpx.post(
        server.base_url + "/admin/login",
        data={"token": token},
        headers={"Origin": server.base_url},
        timeout=10,
    )
    assert response.status_code == 303, response.text
    return response.cookies["pagedchat_admin"]


def admin_status(server: Server, cookie: str) -> int:
    return httpx.get(server.base_url + "/admin", cookies={"pagedchat_admin": cookie}, timeout=10).status_code


def test_admin_sign_outs_and_token_changes_hold_across_restarts(tmp_path, tiny_model):
    token, new_token = "first-admin-token-0123456789", "second-admin-token-0123456789"
    env = server_env(tmp_path, tiny_model, PAGEDCHAT_ADMIN_TOKEN=token)
    first = start_server(tmp_path, env)
    signed_out, kept = sign_in(first, token), sign_in(first, token)
    assert (admin_status(first, signed_out), admin_status(first, kept)) == (200, 200)
    out = httpx.post(
        first.base_url + "/admin/logout",
        cookies={"pagedchat_admin": signed_out},
        headers={"Origin": first.base_url},
        timeout=10,
    )
    assert out.status_code == 303
    assert admin_status(first, signed_out) == 401
    stop_server(first)

    second = start_server(tmp_path, env)  # same token: sign-ins survive, and so does the sign-out
    assert (admin_status(second, signed_out), admin_status(second, kept)) == (401, 200)
    stop_server(second)

    third = start_server(tmp_path, {**env, "PAGEDCHAT_ADMIN_TOKEN": new_token})
    assert admin_status(third, kept) == 401  # a new admin token signs everyone out
    assert admin_status(third, sign_in(third, new_token)) == 200
    stop_server(third)
    fourth = start_server(tmp_path, env)  # and going back to the old token does not bring them back
    try:
        assert admin_status(fourth, kept) == 401
        assert "the admin token or the secret key changed: revoked" in fourth.log()
    finally:
        stop_server(fourth)


def test_a_short_admin_token_stops_the_server_at_start(tmp_path, tiny_model):
    env = server_env(tmp_path, tiny_model, PAGEDCHAT_ADMIN_TOKEN="abcdef")
    with pytest.raises(RuntimeError) as refused:
        start_server(tmp_path, env)
    assert "exited with 2" in str(refused.value)
    assert "admin_token must be at least 16 characters, got 6" in str(refused.value)

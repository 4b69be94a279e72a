"""The admin surface and the request guards, attacked over HTTP and WebSocket against real `pagedchat serve`s: one
with accounts (`--auth local`, no admin token, 127.0.0.1 trusted as a proxy), one without (the defaults).

With accounts, admin is an admin account, never an address: a non-admin account and an anonymous loopback client get
no admin page, state, feed or metrics, and no link to them. Without accounts, loopback is admin only by the server's
own names and not through a proxy. A Host the server does not answer (DNS rebinding) is a 400 on every route,
sockets included. `next` after a sign-in stays on the site, `/login?error=` shows only known codes, and a bad query
parameter is named."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from bench.common.servers import stop_server
from tests.e2e.conftest import Server, server_env, start_server
from tests.e2e.zygote import CHEAP_PASSWORD_HASHES_ENV

ROOT, ROOT_PASSWORD = "root", "root password 1"
BOB, BOB_PASSWORD = "bob", "bob password 1"
CARL, CARL_PASSWORD = "carl", "carl password 1"
REBIND = "rebind.attacker.example"
SECRET_TITLE = "Layoff plan for Q1 (confidential)"
ADMIN_PATHS = ("/api/admin/state", "/api/admin/stream", "/metrics")
LURE = "Your account is locked: call +1 555 0100"


@pytest.fixture(scope="module")
def accounts_server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("surface-accounts")
    env = server_env(
        tmp_path,
        tiny_model,
        PAGEDCHAT_AUTH="local",
        **{CHEAP_PASSWORD_HASHES_ENV: "1"},  # what accounts may do is tested here, not what a hash costs
        PAGEDCHAT_FIRST_ADMIN=ROOT,
        PAGEDCHAT_FIRST_ADMIN_PASSWORD=ROOT_PASSWORD,
        PAGEDCHAT_FORWARDED_ALLOW_IPS="127.0.0.1",
    )
    running = start_server(tmp_path, env)
    root = signed_in(running, ROOT, ROOT_PASSWORD)
    for name, password in ((BOB, BOB_PASSWORD), (CARL, CARL_PASSWORD)):
        created = root.post("/api/users", json={"username": name, "password": password, "role": "user"})
        assert created.status_code == 201, created.text
    titled = root.post("/api/sessions", json={"title": SECRET_TITLE})
    assert titled.status_code == 201, titled.text
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("surface-open")
    running = start_server(tmp_path, server_env(tmp_path, tiny_model))
    yield running
    stop_server(running)


@pytest.fixture(params=["accounts", "open"])
def any_server(request) -> Server:
    return request.getfixturevalue(f"{request.param}_server")


def browser(server: Server, **headers: str) -> httpx.Client:
    """A client sending this server's own Origin, as its pages do, and `headers`."""
    return httpx.Client(base_url=server.base_url, headers={"origin": server.base_url, **headers}, timeout=30)


def signed_in(server: Server, username: str, password: str, **headers: str) -> httpx.Client:
    client = browser(server)
    response = client.post("/auth/login", json={"username": username, "password": password}, headers=headers)
    assert response.status_code == 200, response.text
    return client


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def admin_status(client: httpx.Client, path: str, **headers: str) -> int:
    """The status of an admin endpoint (the feed's stream is left at its headers)."""
    with client.stream("GET", path, headers=headers) as response:
        return response.status_code


def ws_handshake(
    server: Server, host: str, path: str = "/ws/sessions/no-such-session", cookie: str | None = None
) -> None:
    """Open a chat socket on loopback naming `host` in the Host header; InvalidStatus when the upgrade is refused."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    headers = {"Cookie": cookie} if cookie else None
    with connect(f"ws://{host}{path}", sock=sock, open_timeout=10, additional_headers=headers):
        pass


# ---- admin under accounts: an account's role, never an address ---------------------------------------------------
def test_under_accounts_loopback_and_a_user_are_no_admin(accounts_server):
    anonymous = browser(accounts_server)
    for path in ADMIN_PATHS:
        assert admin_status(anonymous, path) == 401, path
    assert error_of(anonymous.get("/api/admin/state")) == (401, "admin_account_required")
    page = anonymous.get("/admin")
    assert page.status_code == 401 and 'id="block-map"' not in page.text and "/login?next=/admin" in page.text
    bob = signed_in(accounts_server, BOB, BOB_PASSWORD)
    for path in ADMIN_PATHS:
        assert admin_status(bob, path) == 403, path
    assert error_of(bob.get("/api/admin/state")) == (403, "admin_account_required")
    page = bob.get("/admin")
    assert page.status_code == 403 and 'id="block-map"' not in page.text
    chat = bob.get("/")
    assert chat.status_code == 200 and 'href="/account"' in chat.text
    assert 'href="/admin"' not in chat.text  # no link for a user


def test_an_admin_account_is_admin_and_sees_the_link(accounts_server):
    root = signed_in(accounts_server, ROOT, ROOT_PASSWORD)
    assert 'href="/admin"' in root.get("/").text
    assert root.get("/admin").status_code == 200
    for path in ADMIN_PATHS:
        assert admin_status(root, path) == 200, path
    # through the trusted proxy (127.0.0.1) from elsewhere: an admin account is an admin from anywhere
    assert admin_status(root, "/api/admin/state", **{"x-forwarded-for": "203.0.113.9"}) == 200


def test_no_warning_at_start_when_accounts_guard_the_admin_surface(accounts_server, open_server):
    assert "the admin surface is open" not in accounts_server.log()
    warning = next(line for line in open_server.log().splitlines() if "the admin surface is open" in line)
    assert " WARNING " in warning and "PAGEDCHAT_ADMIN_TOKEN" in warning


# ---- the Host header: every route, HTTP and WebSocket ---------------------------------------------------------------
HTTP_ROUTES = [
    ("GET", "/"),
    ("GET", "/health"),
    ("GET", "/login"),
    ("GET", "/admin"),
    ("GET", "/api/admin/state"),
    ("GET", "/api/admin/stream"),
    ("GET", "/metrics"),
    ("GET", "/static/login.js"),
    ("GET", "/api/sessions"),
    ("POST", "/api/sessions"),
    ("GET", "/v1/models"),
    ("POST", "/auth/login"),
]


def test_a_host_the_server_does_not_answer_is_refused_on_every_route(any_server):
    client = browser(any_server, host=REBIND, origin=f"http://{REBIND}")  # rebinding: Origin equals Host
    for method, path in HTTP_ROUTES:
        response = client.request(method, path, json={} if method == "POST" else None)
        assert error_of(response) == (400, "host_not_allowed"), (method, path, response.text)
        message = response.json()["error"]["message"]
        assert f"Host '{REBIND}'" in message and "--allowed-hosts" in message
        assert "set-cookie" not in response.headers
    with pytest.raises(InvalidStatus) as refused:
        ws_handshake(any_server, REBIND)
    assert refused.value.response.status_code == 400
    assert REBIND in refused.value.response.body.decode()
    with pytest.raises(InvalidStatus) as refused:  # a port does not make it another host
        ws_handshake(any_server, f"{REBIND}:{any_server.port}")
    assert refused.value.response.status_code == 400


def test_the_default_hosts_are_answered_and_loopback_is_admin_by_them(open_server):
    port = open_server.port
    owner = browser(open_server)
    sid = owner.post("/api/sessions", json={"title": "hosts"}).json()["id"]
    cookie = "; ".join(f"{name}={value}" for name, value in owner.cookies.items())
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "127.0.0.1"):
        client = browser(open_server, host=host)
        assert client.get("/health").status_code == 200, host
        assert client.get("/api/admin/state").status_code == 200, host
        assert 'href="/admin"' in client.get("/").text, host
        ws_handshake(open_server, host, f"/ws/sessions/{sid}", cookie)  # upgraded


# ---- proxies: X-Forwarded-For believed from forwarded_allow_ips only; a proxied request is never loopback --------
@pytest.mark.parametrize(
    "forwarded",
    [
        {"x-forwarded-for": "127.0.0.1"},
        {"forwarded": "for=127.0.0.1"},
        {"x-real-ip": "127.0.0.1"},
        {"via": "1.1 nginx"},
    ],
)
def test_a_request_through_a_proxy_is_not_loopback(open_server, forwarded):
    client = browser(open_server)
    assert client.get("/api/admin/state").status_code == 200  # the machine's own user, directly
    through = client.get("/api/admin/state", headers=forwarded)
    assert error_of(through) == (403, "admin_loopback_only")
    assert "proxy" in through.json()["error"]["message"]
    assert admin_status(client, "/api/admin/stream", **forwarded) == 403
    assert 'href="/admin"' not in client.get("/", headers=forwarded).text


def test_forwarded_for_names_the_client_behind_a_trusted_proxy(accounts_server):
    # the proxy (127.0.0.1, trusted) appended the peer it saw; the leftmost entry is the client's own claim
    signed_in(accounts_server, CARL, CARL_PASSWORD, **{"x-forwarded-for": "127.0.0.1, 203.0.113.9"})
    with sqlite3.connect(f"file:{accounts_server.db_path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT s.client FROM user_sessions s JOIN users u ON u.id = s.user_id WHERE u.username = ?",
            (CARL,),
        ).fetchall()
    assert rows == [("203.0.113.9",)]  # the rightmost address that is not a trusted proxy


# ---- sign-in page: where `next` leads, what `error` shows ---------------------------------------------------------
def lures(server: Server) -> list[str]:
    other = urlsplit(server.base_url.replace("127.0.0.1", "localhost")).netloc  # another origin
    return [
        f"/\t/{other}/phish",
        f"/\\{other}/phish",
        f"/\n/{other}/phish",
        f"//{other}/phish",
        f"/ /{other}/phish",
        f"http://{other}/phish",
        f"/\x00/{other}",
    ]


def test_next_after_a_sign_in_stays_on_the_site(accounts_server):
    client = browser(accounts_server)
    tab, backslash = lures(accounts_server)[:2]
    for lure, expected in (
        (tab, "/"),
        (backslash, "/"),
        ("/account?x=1", "/account?x=1"),
    ):  # a hash each: few
        response = client.post("/auth/login", json={"username": BOB, "password": BOB_PASSWORD, "next": lure})
        assert (response.status_code, response.json()["next"]) == (200, expected), repr(lure)
    for lure in lures(accounts_server):  # signed in: /login redirects to `next` at once
        again = client.get("/login", params={"next": lure}, follow_redirects=False)
        assert (again.status_code, again.headers["location"]) == (303, "/"), repr(lure)


def test_the_sign_in_page_shows_known_error_codes_only(accounts_server):
    client = browser(accounts_server)
    for error in (LURE, "<b>bold</b>", "not_a_code"):
        page = client.get("/login", params={"error": error})
        assert (
            page.status_code == 200
            and '<p id="login-error" class="form-error" role="alert"></p>' in page.text
        )
        assert "555" not in page.text and "not_a_code" not in page.text and "bold" not in page.text
    ended = client.get("/login", params={"error": "session_ended"})
    assert "Your sign-in has ended" in ended.text


# ---- query parameters: an error names the parameter and its range ------------------------------------------------
def test_a_bad_query_parameter_is_named(open_server):
    client = browser(open_server)
    client.get("/")  # the browser cookie
    for name, raw, limits in (
        ("limit", "²", "from 1 to 50"),
        ("offset", "٣", "from 0 to"),
        ("limit", " 7", ""),
    ):
        response = client.get("/api/search", params={"q": "kv", name: raw})
        assert response.status_code == 400, (name, raw)
        error = response.json()["error"]
        assert error["param"] == name and error["message"].startswith(f"{name} must be an integer {limits}")
        assert repr(raw) in error["message"]
    state = client.get("/api/admin/stream", params={"start": "²"})
    assert state.json()["error"]["message"] == "start must be an integer, got '²'"

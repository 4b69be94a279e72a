"""CSRF: writes authenticated by the browser cookie must come from the server's own pages; API keys are unaffected."""

from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from app.http.csrf import cross_origin_reason, parse_origin
from app.http.security import BROWSER_COOKIE
from app.settings import Settings
from tests.app.factories import LOOPBACK_CLIENT, make_client

OWN = "http://testserver"
EVIL = "http://evil.example"
JSON = {"content-type": "application/json"}
TEXT = {"content-type": "text/plain"}  # what a cross-site page may send without a preflight
ADMIN_TOKEN = "admin-csrf-token"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("csrf"), api_keys=("sk-csrf",), admin_token=ADMIN_TOKEN) as c:
        yield c


def browser(client: TestClient) -> TestClient:
    """A fresh browser on the running app holding its cookie, sending no Origin unless a request gives one."""
    other = TestClient(client.app, client=LOOPBACK_CLIENT)
    other.portal = client.portal  # the app's one event loop
    assert other.get("/").status_code == 200 and BROWSER_COOKIE in other.cookies
    return other


def sessions_of(victim: TestClient) -> list[dict]:
    response = victim.get("/api/sessions")
    assert response.status_code == 200, response.text
    return response.json()["sessions"]


def check_refused(response, fragment: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "cross_origin_request"
    assert fragment in error["message"], error["message"]


def test_a_cross_site_text_plain_post_creates_nothing(client):
    victim = browser(client)
    response = victim.post("/api/sessions", content='{"title": "pwned"}', headers={"origin": EVIL, **TEXT})
    check_refused(response, "its Origin 'http://evil.example' is neither this server's (http://testserver)")
    assert sessions_of(victim) == []
    # the same with a JSON body, and from another port of the same host (same site, another origin)
    for origin in (EVIL, "http://testserver:8081", "https://testserver"):
        response = victim.post("/api/sessions", json={"title": "pwned"}, headers={"origin": origin})
        check_refused(response, f"its Origin {origin!r}")
    assert sessions_of(victim) == []


def test_cross_site_writes_to_an_existing_session_change_nothing(client):
    victim = browser(client)
    sid = victim.post("/api/sessions", json={"title": "mine"}, headers={"origin": OWN}).json()["id"]
    evil = {"origin": EVIL}
    check_refused(
        victim.post(f"/api/sessions/{sid}/messages", content='{"content": "hi"}', headers={**evil, **TEXT}),
        EVIL,
    )
    check_refused(victim.patch(f"/api/sessions/{sid}", json={"title": "pwned"}, headers=evil), EVIL)
    check_refused(victim.post(f"/api/sessions/{sid}/regenerate", headers=evil), EVIL)
    check_refused(victim.post(f"/api/sessions/{sid}/stop", headers=evil), EVIL)
    check_refused(victim.delete(f"/api/sessions/{sid}", headers=evil), EVIL)
    session = victim.get(f"/api/sessions/{sid}").json()
    assert (session["title"], session["messages"]) == ("mine", [])


def test_the_chat_pages_own_requests_pass(client):
    victim = browser(client)
    own = {"origin": OWN}
    created = victim.post("/api/sessions", json={"title": "ok"}, headers=own)
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    assert victim.patch(f"/api/sessions/{sid}", json={"title": "renamed"}, headers=own).status_code == 200
    assert victim.post(f"/api/sessions/{sid}/stop", headers=own).json() == {"stopped": False}
    assert victim.delete(f"/api/sessions/{sid}", headers=own).status_code == 204


def test_a_same_origin_body_must_be_json(client):
    victim = browser(client)
    response = victim.post("/api/sessions", content='{"title": "x"}', headers={"origin": OWN, **TEXT})
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert "'text/plain'" in response.json()["error"]["message"]
    assert sessions_of(victim) == []
    with_charset = {"origin": OWN, "content-type": "application/json; charset=utf-8"}
    assert victim.post("/api/sessions", content="{}", headers=with_charset).status_code == 201


def test_without_origin_a_same_origin_referer_or_fetch_metadata_stands_in(client):
    victim = browser(client)
    for headers in (
        {"referer": f"{OWN}/"},
        {"origin": "null", "sec-fetch-site": "same-origin"},  # a form posted under a strict referrer policy
        {"sec-fetch-site": "same-origin"},
    ):
        assert victim.post("/api/sessions", json={}, headers=headers).status_code == 201, headers
    check_refused(victim.post("/api/sessions", json={}), "no Origin and no same-origin Referer")
    check_refused(victim.post("/api/sessions", json={}, headers={"origin": "null"}), "Origin null")
    check_refused(victim.post("/api/sessions", json={}, headers={"referer": f"{EVIL}/page"}), "its Referer")
    cross = {"origin": "null", "sec-fetch-site": "cross-site"}
    check_refused(victim.post("/api/sessions", json={}, headers=cross), "Origin null")
    assert len(sessions_of(victim)) == 3


def test_reads_need_no_origin(client):
    victim = browser(client)
    assert victim.get("/api/sessions", headers={"origin": EVIL}).status_code == 200


def test_api_key_requests_are_unaffected(client):
    keyed = TestClient(client.app, client=LOOPBACK_CLIENT, headers={"authorization": "Bearer sk-csrf"})
    keyed.portal = client.portal
    created = keyed.post("/api/sessions", json={"title": "tool"}, headers={"origin": EVIL})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    assert keyed.patch(f"/api/sessions/{sid}", content='{"title": "t"}', headers=TEXT).status_code == 200
    assert keyed.delete(f"/api/sessions/{sid}").status_code == 204


def test_admin_sign_in_and_out_from_another_origin_are_refused(client):
    admin = browser(client)
    form = {"token": ADMIN_TOKEN}
    login = admin.post("/admin/login", data=form, headers={"origin": EVIL}, follow_redirects=False)
    check_refused(login, "/admin/login must be posted from this server's own admin page")
    assert "set-cookie" not in login.headers
    assert admin.post("/admin/login", data=form, follow_redirects=False).status_code == 403  # no Origin
    signed_in = admin.post("/admin/login", data=form, headers={"origin": OWN}, follow_redirects=False)
    assert signed_in.status_code == 303 and "pagedchat_admin=" in signed_in.headers["set-cookie"]
    logout = admin.post("/admin/logout", headers={"origin": EVIL}, follow_redirects=False)
    check_refused(logout, "/admin/logout must be posted")
    assert "set-cookie" not in logout.headers
    assert admin.post("/admin/logout", headers={"origin": OWN}, follow_redirects=False).status_code == 303


def test_pages_tell_browsers_to_send_their_origin(client):
    # under `no-referrer` browsers post same-origin forms with `Origin: null`
    assert client.get("/").headers["referrer-policy"] == "same-origin"


def make_request(headers: dict[str, str], scheme: str = "http") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": "POST", "scheme": scheme, "path": "/api/sessions", "headers": raw}
    return Request(scope)


@pytest.mark.parametrize(
    ("headers", "allowed", "ok"),
    [
        ({"host": "chat.example", "origin": "http://chat.example"}, (), True),
        ({"host": "chat.example", "origin": "http://chat.example:80"}, (), True),
        ({"host": "CHAT.example:8000", "origin": "http://chat.example:8000"}, (), True),
        ({"host": "chat.example:8000", "origin": "http://chat.example:8001"}, (), False),
        ({"host": "chat.example", "origin": "https://chat.example"}, (), False),
        ({"host": "chat.example", "origin": "http://chat.example.evil"}, (), False),
        ({"host": "chat.example", "origin": "http://app.example"}, ("http://app.example",), True),
        ({"host": "chat.example", "origin": "http://app.example:81"}, ("http://app.example",), False),
        ({"host": "chat.example", "origin": "not a url"}, (), False),
        ({"host": "chat.example", "referer": "http://chat.example/x?y"}, (), True),
        ({"origin": "http://chat.example"}, (), False),  # no Host: nothing to compare with
    ],
)
def test_same_origin_rules(headers, allowed, ok):
    reason = cross_origin_reason(make_request(headers), Settings(allowed_origins=allowed))
    assert (reason is None) == ok, reason


def test_with_a_secure_cookie_the_servers_origin_is_https_even_behind_a_tls_proxy():
    secure = Settings(cookie_secure=True)
    behind_proxy = {
        "host": "chat.example",
        "origin": "https://chat.example",
    }  # the proxy speaks plain HTTP to us
    assert cross_origin_reason(make_request(behind_proxy), secure) is None
    assert cross_origin_reason(make_request(behind_proxy), Settings()) is not None
    plain = {"host": "chat.example", "origin": "http://chat.example"}
    assert cross_origin_reason(make_request(plain), secure) is not None


def test_origins_are_compared_with_default_ports():
    assert parse_origin("https://Example.com") == ("https", "example.com", 443)
    assert parse_origin("http://example.com:8000/path") == ("http", "example.com", 8000)
    assert parse_origin("ftp://example.com") is None
    assert parse_origin("http://example.com:99999") is None

"""Who may touch what: signed cookies, Origin checks, session ownership, admin and API-key checks, page headers."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

import app.http.security
from tests.app.factories import make_client
from tests.reliability.helpers import HELLO, peer, session_events, wait_service_idle

KEYS = ("sk-alpha", "sk-beta")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("security"), allowed_origins=("https://chat.example",)) as c:
        yield c


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("keyed"), api_keys=KEYS, admin_token="adm-secret-0123456789"
    ) as c:
        yield c


def browser(client: TestClient) -> TestClient:
    """Another browser: same app, its own cookie jar (and a cookie handed out by its first page load)."""
    other = peer(client)
    assert other.get("/api/sessions").status_code == 200
    return other


def test_the_browser_cookie_is_signed_httponly_and_samesite(client):
    fresh = peer(client)
    cookie = fresh.get("/api/sessions").headers["set-cookie"]
    name, _, rest = cookie.partition("=")
    value, *attributes = [part.strip() for part in rest.split(";")]
    assert name == "pagedchat_browser"
    assert {"HttpOnly", "SameSite=Lax", "Path=/"} <= set(attributes)
    browser_id, _, signature = value.rpartition(".")
    assert len(browser_id) >= 32 and signature  # 192 random bits, then an HMAC
    forged = peer(client, cookies={name: browser_id + ".forged"})
    again = forged.get("/api/sessions")
    assert again.headers["set-cookie"].split(";")[0] != f"{name}={value}"  # a forged cookie is a new identity


def test_session_ids_are_unguessable(client):
    ids = [client.post("/api/sessions").json()["id"] for _ in range(40)]
    assert len(set(ids)) == len(ids)
    for sid in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22,}", sid), sid  # >= 128 random bits, URL-safe
    assert len({sid[:6] for sid in ids}) == len(ids)  # no shared prefix: not a counter or a timestamp


def attempts(stranger: TestClient, sid: str) -> list[tuple[str, int]]:
    """Every way a stranger could read, change or use someone else's session, with its status."""
    calls = [
        ("GET", f"/api/sessions/{sid}", None),
        ("GET", f"/api/sessions/{sid}/messages", None),
        ("PATCH", f"/api/sessions/{sid}", {"title": "mine now"}),
        ("POST", f"/api/sessions/{sid}/messages", {"content": "hello?"}),
        ("POST", f"/api/sessions/{sid}/regenerate", None),
        ("POST", f"/api/sessions/{sid}/edit", {"content": "edited"}),
        ("POST", f"/api/sessions/{sid}/stop", None),
        ("DELETE", f"/api/sessions/{sid}", None),
    ]
    return [(f"{m} {p}", stranger.request(m, p, json=body).status_code) for m, p, body in calls]


def check_untouched(owner: TestClient, sid: str) -> None:
    body = owner.get(f"/api/sessions/{sid}").json()
    assert body["title"] == "private"
    assert [m["content"] for m in body["messages"]][0] == "my secret"


def test_another_browser_gets_404_for_everything(client):
    sid = client.post("/api/sessions", json={"title": "private", "settings": {"max_tokens": 3}}).json()["id"]
    session_events(client, sid, "my secret")
    stranger = browser(client)
    assert all(status == 404 for _, status in attempts(stranger, sid)), attempts(stranger, sid)
    assert stranger.get("/api/sessions").json()["sessions"] == []
    with stranger.websocket_connect(f"/ws/sessions/{sid}") as ws:
        frame = ws.receive_json()
        assert (frame["type"], frame["status"], frame["code"]) == ("error", 404, "not_found")
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 4404
    check_untouched(client, sid)
    wait_service_idle(client)


def test_another_api_key_gets_404_and_a_key_is_not_a_browser(keyed):
    alpha = peer(keyed, headers={"authorization": "Bearer sk-alpha"})
    beta = peer(keyed, headers={"authorization": "Bearer sk-beta"})
    sid = alpha.post("/api/sessions", json={"title": "private", "settings": {"max_tokens": 3}}).json()["id"]
    session_events(alpha, sid, "my secret")
    for stranger in (beta, peer(keyed)):
        assert all(status == 404 for _, status in attempts(stranger, sid)), attempts(stranger, sid)
    check_untouched(alpha, sid)


def test_websocket_origin_is_checked(client):
    sid = client.post("/api/sessions").json()["id"]
    for origin in ("https://evil.example", "null", "http://testserver.evil.example"):
        with (
            pytest.raises(WebSocketDisconnect) as refused,
            client.websocket_connect(f"/ws/sessions/{sid}", headers={"origin": origin}),
        ):
            pass
        assert refused.value.code == 1008
    for origin in ("http://testserver", "https://chat.example"):  # its own origin, a configured one
        with client.websocket_connect(f"/ws/sessions/{sid}", headers={"origin": origin}) as ws:
            ws.send_json({"type": "ping"})
            assert ws.receive_json() == {"type": "pong"}


def test_admin_needs_the_token_compared_in_constant_time(keyed, monkeypatch):
    compared = []
    real = app.http.security.hmac.compare_digest
    monkeypatch.setattr(
        app.http.security.hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b)
    )
    remote = peer(keyed, client=("203.0.113.7", 4000))
    assert remote.get("/api/admin/state").status_code == 401
    assert keyed.get("/api/admin/state").status_code == 401  # loopback is not enough once a token is set
    assert compared == []
    assert (
        remote.get("/api/admin/state", headers={"x-admin-token": "adm-secret-012345678X"}).status_code == 403
    )
    assert compared, "the admin token must be compared with hmac.compare_digest"
    assert (
        remote.get("/api/admin/state", headers={"x-admin-token": "adm-secret-0123456789"}).status_code == 200
    )


def test_without_an_admin_token_the_admin_surface_is_loopback_only(client):
    assert client.get("/api/admin/state").status_code == 200
    for host in ("203.0.113.7", "10.0.0.2", "::ffff:8.8.8.8"):
        response = peer(client, client=(host, 4000)).get("/api/admin/state")
        assert (response.status_code, response.json()["error"]["code"]) == (403, "admin_loopback_only")


def test_api_keys_are_required_on_every_v1_route(keyed):
    routes = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2}),
        ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ]
    anonymous = peer(keyed)
    for method, path, body in routes:
        for headers in ({}, {"authorization": "Bearer sk-gamma"}, {"authorization": "Basic sk-alpha"}):
            response = anonymous.request(method, path, json=body, headers=headers)
            assert (response.status_code, response.json()["error"]["code"]) == (401, "invalid_api_key")
        ok = anonymous.request(method, path, json=body, headers={"authorization": "Bearer sk-beta"})
        assert ok.status_code == 200


class _ScriptAudit(HTMLParser):
    """Collects what a CSP without 'unsafe-inline' would block: inline scripts, on* handlers, javascript: URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script":
            self._in_script = "src" not in names
        for name, value in attrs:
            if name.startswith("on") or (value or "").strip().lower().startswith("javascript:"):
                self.problems.append(f"<{tag} {name}={value!r}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append(f"inline script {data.strip()[:40]!r}")


@pytest.mark.parametrize("path", ["/", "/admin", "/health", "/no/such/page"])
def test_security_headers_on_every_response(client, path):
    response = client.get(path)
    assert response.headers["x-content-type-options"] == "nosniff"
    csp = dict((d.split(" ", 1) + [""])[:2] for d in response.headers["content-security-policy"].split("; "))
    assert csp["script-src"] == "'self'"  # no 'unsafe-inline', no 'unsafe-eval'
    assert csp["frame-ancestors"] == "'none'"
    assert csp["object-src"] == "'none'"
    assert response.headers["x-frame-options"] == "DENY"
    if response.headers["content-type"].startswith("text/html"):
        audit = _ScriptAudit()
        audit.feed(response.text)
        assert audit.problems == []

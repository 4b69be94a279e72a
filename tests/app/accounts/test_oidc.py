"""OpenID Connect sign-in (`--auth oidc`) end to end: pagedchat and the test provider (tests/app/oidc_provider.py)
both served on 127.0.0.1, an httpx client following the redirects as a browser would. The flow uses PKCE, state and
nonce. A hostile provider's answers are attacked on a real server in tests/e2e/test_security_oidc.py; here, the
single-use record of states they rely on."""

from __future__ import annotations

import httpx
import pytest

from app.accounts.oidc import SpentStates
from app.main import create_app
from tests.app.factories import make_settings, make_tiny_model_dir
from tests.app.oidc_provider import CLIENT_ID, CLIENT_SECRET, free_port, running_provider, serve_in_thread


@pytest.fixture(scope="module")
def provider():
    with running_provider() as p:
        yield p


@pytest.fixture(scope="module")
def server(tmp_path_factory, provider) -> str:
    settings = make_settings(
        tmp_path_factory.mktemp("oidc"),
        make_tiny_model_dir(),
        auth="oidc",
        oidc_issuer=provider.issuer,
        oidc_client_id=CLIENT_ID,
        oidc_client_secret=CLIENT_SECRET,
    )
    with serve_in_thread(create_app(settings), free_port()) as base_url:
        yield base_url


@pytest.fixture
def faults(provider):
    provider.faults.clear()
    yield provider.faults
    provider.faults.clear()


def browser(server: str) -> httpx.Client:
    return httpx.Client(base_url=server, follow_redirects=True, timeout=30)


def test_sign_in_through_the_provider_makes_one_account_per_identity(server, provider, faults):
    with browser(server) as client:
        assert client.get("/").url.path == "/login"
        assert 'id="oidc-sign-in"' in client.get("/login").text
        landed = client.get("/auth/oidc/login", params={"next": "/account"})
        assert (landed.status_code, landed.url.path) == (200, "/account")
        hops = [str(r.url).split("?")[0] for r in landed.history]
        assert hops == [
            f"{server}/auth/oidc/login",
            f"{provider.issuer}/authorize",
            f"{server}/auth/oidc/callback",
        ]
        me = client.get("/auth/me").json()["user"]
        assert (me["username"], me["oidc"], me["password"], me["role"]) == ("tess", True, False, "user")
        created = client.post(
            "/api/sessions", json={"title": "from the provider"}, headers={"origin": server}
        )
        assert created.status_code == 201, created.text
    exchange = provider.token_requests[-1]
    assert exchange["grant_type"] == "authorization_code" and len(exchange["code_verifier"]) >= 43  # PKCE
    with browser(server) as again:  # another device, the same identity: the same account and chats
        again.get("/auth/oidc/login")
        assert again.get("/auth/me").json()["user"]["id"] == me["id"]
        assert [s["title"] for s in again.get("/api/sessions").json()["sessions"]] == ["from the provider"]


def test_a_callback_without_its_flow_is_refused(server, faults):
    with browser(server) as client:
        forged = client.get("/auth/oidc/callback", params={"code": "stolen", "state": "guessed"})
        assert forged.status_code == 401 and "pagedchat_session" not in client.cookies
        assert client.get("/api/sessions").status_code == 401


def test_a_state_is_spent_once_and_forgotten_when_its_flow_cookie_would_have_expired():
    now = [1000.0]
    spent = SpentStates(ttl_s=600, clock=lambda: now[0])
    assert spent.spend("a") and not spent.spend("a")
    now[0] += 300
    assert spent.spend("b") and not spent.spend("a") and len(spent) == 2
    now[0] += 300  # "a" is 600 s old: its cookie no longer verifies, so it need not be remembered
    assert spent.spend("c") and len(spent) == 2 and not spent.spend("b")
    now[0] += 600
    assert spent.spend("a") and len(spent) == 1


def test_a_callback_shows_no_text_from_its_url(server, faults):
    """A callback's `error` and `error_description` are anyone's to put in a link: the page names only a known OAuth
    error code, never the description (it goes to the log)."""
    with browser(server) as client:
        lure = "Your account is locked: call +1 555 0100"
        forged = client.get(
            "/auth/oidc/callback", params={"error": "access_denied", "error_description": lure}
        )
        assert forged.status_code == 401 and "555" not in forged.text
        unknown = client.get("/auth/oidc/callback", params={"error": "Call +1 555 0100 now"})
        assert unknown.status_code == 401 and "555" not in unknown.text

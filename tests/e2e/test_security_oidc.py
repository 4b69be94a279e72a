"""OpenID Connect sign-in against a hostile provider, attacked on a real `pagedchat serve --auth oidc`.

One provider (tests/app/oidc_provider.py, in this process on 127.0.0.1) and one server for the module; each test
switches the provider's faults. An httpx client plays the browser, one redirect at a time, so a test can hold the
callback URL and the flow cookie: replay them, hand them to another browser, forge them. Every refusal is checked the
same way (`assert_refused`): no session cookie, no account for the identity, a refusal (the sign-in page or a
redirect to /login?error=) and the server's log naming the reason's code (app/accounts/oidc.py REFUSALS).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from app.accounts.oidc import FLOW_COOKIE
from app.http.account_auth import ACCOUNT_COOKIE
from bench.common.servers import stop_server
from tests.app.oidc_provider import CLIENT_ID, CLIENT_SECRET, Provider, running_provider
from tests.e2e.conftest import Server, server_env, start_server

SECRET_KEY = "oidc-security-test-secret-key-0123456789"  # shared by the second instance of one deployment


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with running_provider() as p:
        yield p


def oidc_env(tmp_path, tiny_model: str, provider: Provider) -> dict[str, str]:
    return server_env(
        tmp_path,
        tiny_model,
        PAGEDCHAT_AUTH="oidc",
        PAGEDCHAT_OIDC_ISSUER=provider.issuer,
        PAGEDCHAT_OIDC_CLIENT_ID=CLIENT_ID,
        PAGEDCHAT_OIDC_CLIENT_SECRET=CLIENT_SECRET,
        PAGEDCHAT_SECRET_KEY=SECRET_KEY,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model, provider) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("oidc-server")
    running = start_server(tmp_path, oidc_env(tmp_path, tiny_model, provider))
    yield running
    stop_server(running)


@pytest.fixture
def subject(provider) -> Iterator[str]:
    """A fresh identity at the provider for this test (so "no account" means this sign-in made none), no faults."""
    sub = "sub-" + uuid.uuid4().hex[:12]
    provider.user = {"sub": sub, "preferred_username": "u" + sub[-12:]}
    provider.faults.clear()
    yield sub
    provider.faults.clear()


def browser() -> httpx.Client:
    """A browser that follows no redirect by itself."""
    return httpx.Client(follow_redirects=False, timeout=30)


def authorize(client: httpx.Client, server: Server) -> str:
    """Start a sign-in on `server` and pass the provider's consent: the callback URL the provider sends back."""
    start = client.get(server.base_url + "/auth/oidc/login")
    assert start.status_code == 302 and FLOW_COOKIE in client.cookies, start.text
    back = client.get(start.headers["location"])
    assert back.status_code == 302, back.text
    return back.headers["location"]


def accounts_of(server: Server, sub: str) -> int:
    with sqlite3.connect(f"file:{server.db_path}?mode=ro", uri=True) as db:
        return db.execute("SELECT count(*) FROM users WHERE oidc_subject = ?", (sub,)).fetchone()[0]


def assert_signed_in(response: httpx.Response, client: httpx.Client, server: Server, sub: str) -> None:
    assert response.status_code == 303, response.text[-2000:]
    assert client.cookies.get(ACCOUNT_COOKIE) and accounts_of(server, sub) == 1
    assert client.get(server.base_url + "/auth/me").json()["user"]["oidc"] is True


def no_session_cookie(response: httpx.Response) -> bool:
    return not [h for h in response.headers.get_list("set-cookie") if h.startswith(ACCOUNT_COOKIE + "=")]


def assert_refused(
    response: httpx.Response, client: httpx.Client, server: Server, sub: str | None, log_from: int, code: str
) -> str:
    """The sign-in was refused, for `code`, and made no account for `sub` (unless None); the log's refusal line."""
    assert no_session_cookie(response) and ACCOUNT_COOKIE not in client.cookies, response.headers
    assert sub is None or accounts_of(server, sub) == 0
    if response.is_redirect:
        target = urlsplit(response.headers["location"])
        assert target.path == "/login" and "error=" in target.query, response.headers["location"]
    else:
        assert response.status_code in (400, 401, 403, 502), response.status_code
    assert client.get(server.base_url + "/auth/me").status_code == 401
    return refusal_logged(server, log_from, code)


def refusal_logged(server: Server, log_from: int, code: str) -> str:
    """The server's log line since `log_from` that says why a sign-in was refused; it names `code`."""
    marker = "OpenID Connect sign-in refused"
    deadline = time.monotonic() + 5  # written before the response, read back from a file
    while marker not in (log := server.log()[log_from:]):
        assert time.monotonic() < deadline, f"no {marker!r} in the log:\n{log[-3000:]}"
        time.sleep(0.02)
    line = log[log.index(marker) :].splitlines()[0]
    assert line.startswith(f"{marker} ({code}): "), line
    return line


def test_an_honest_provider_signs_in(server, provider, subject):
    with browser() as client:
        assert_signed_in(client.get(authorize(client, server)), client, server, subject)


@pytest.mark.parametrize(
    ("fault", "code", "reason"),
    [
        ("wrong_issuer", "oidc_id_token", "iss"),
        ("wrong_audience", "oidc_id_token", "aud"),
        ("extra_audience", "oidc_audience", "untrusted-party"),
        ("extra_audience_no_azp", "oidc_id_token", "azp"),
        ("foreign_azp", "oidc_id_token", "azp"),
        ("wrong_nonce", "oidc_id_token", "nonce"),
        ("no_nonce", "oidc_id_token", "nonce"),
        ("expired", "oidc_id_token", "expired"),
        ("future_iat", "oidc_id_token", "issued in the future"),
        ("hs256_public_key", "oidc_algorithm", "'HS256'"),
        ("alg_none", "oidc_algorithm", "'none'"),
        ("foreign_key", "oidc_id_token", "signature"),
        ("unknown_key", "oidc_id_token", "k9"),
        ("kid_other_key", "oidc_id_token", "signature"),
        ("no_id_token", "oidc_no_id_token", "no ID token"),
        ("deny", "oidc_provider_error", "access_denied"),
    ],
)
def test_a_hostile_answer_signs_no_one_in(server, provider, subject, fault, code, reason):
    provider.faults.add(fault)
    with browser() as client:
        callback = authorize(client, server)
        log_from = len(server.log())
        line = assert_refused(client.get(callback), client, server, subject, log_from, code)
        assert reason in line, line


@pytest.mark.parametrize("code_reuse", [False, True], ids=["provider-refuses-reuse", "provider-allows-reuse"])
def test_a_replayed_callback_is_refused(server, provider, subject, code_reuse):
    """The callback URL and the flow cookie, copied before the callback (a proxy log, a shared screen), sent again
    after the sign-in: refused by the state, before the code reaches the provider again."""
    if code_reuse:
        provider.faults.add("code_reuse")
    with browser() as victim:
        callback = authorize(victim, server)
        flow_cookie = victim.cookies[FLOW_COOKIE]
        assert_signed_in(victim.get(callback), victim, server, subject)
        redemptions = len(provider.token_requests)
        log_from = len(server.log())
        again = victim.get(callback)  # the same browser: its flow cookie no longer holds the state
        assert no_session_cookie(again) and refusal_logged(server, log_from, "oidc_state")
    with browser() as attacker:
        attacker.cookies.set(FLOW_COOKIE, flow_cookie)
        log_from = len(server.log())
        line = assert_refused(attacker.get(callback), attacker, server, None, log_from, "oidc_state")
        assert "already used" in line, line
    assert len(provider.token_requests) == redemptions  # the replays never reached the token endpoint
    assert accounts_of(server, subject) == 1
    if not code_reuse:  # and the provider, as real ones do, would have refused the code's second redemption
        code = parse_qs(urlsplit(callback).query)["code"][0]
        form = {"grant_type": "authorization_code", "code": code, "client_id": CLIENT_ID}
        second = httpx.post(provider.issuer + "/token", data={**form, "client_secret": CLIENT_SECRET})
        assert (second.status_code, second.json()["error"]) == (400, "invalid_grant")


def test_another_browsers_callback_is_refused_and_leaves_its_sign_in_alone(server, subject):
    """Browser A starts a sign-in; its callback URL reaches browser B (login CSRF, or a leaked link): B, with no flow
    or with a flow of its own, is refused, and A's sign-in still completes."""
    with browser() as a, browser() as b:
        callback = authorize(a, server)
        log_from = len(server.log())
        assert_refused(b.get(callback), b, server, subject, log_from, "oidc_state")
        authorize(b, server)  # B's own flow cookie, its own state
        log_from = len(server.log())
        assert_refused(b.get(callback), b, server, subject, log_from, "oidc_state")
        assert_signed_in(a.get(callback), a, server, subject)


def test_an_error_injected_into_the_callback_is_refused_without_its_text(server, subject):
    """An `error` on a callback with no flow of this browser's is refused for its state; its description, anyone's
    text, is not shown. With the browser's own state it is the provider's answer (see `deny` above)."""
    lure = "Your account is locked: call +1 555 0100"
    with browser() as client:
        callback = urlsplit(authorize(client, server))
        for state in ("forged-state", ""):
            params = {"error": "access_denied", "error_description": lure, "state": state}
            log_from = len(server.log())
            injected = client.get(f"{server.base_url}{callback.path}?{urlencode(params)}")
            assert_refused(injected, client, server, subject, log_from, "oidc_state")
            assert lure not in injected.text and lure not in server.log()[log_from:]


def test_a_discovery_document_naming_another_issuer_is_refused(
    server, provider, subject, tmp_path, tiny_model
):
    """Another instance of the deployment (same secret key), or this one restarted, reads discovery first at a
    callback of a sign-in started before: it must check the issuer there too, not only at /auth/oidc/login."""
    fresh = start_server(tmp_path, oidc_env(tmp_path, tiny_model, provider))
    try:
        with browser() as client:
            callback = urlsplit(authorize(client, server))
            provider.faults |= {
                "discovery_issuer",
                "wrong_issuer",
            }  # discovery and ID token agree: the impostor
            log_from = len(fresh.log())
            answer = client.get(f"{fresh.base_url}{callback.path}?{callback.query}")
            line = assert_refused(answer, client, fresh, subject, log_from, "oidc_issuer")
            assert "https://impostor.example" in line, line
            log_from = len(fresh.log())
            assert_refused(
                client.get(fresh.base_url + "/auth/oidc/login"),
                client,
                fresh,
                subject,
                log_from,
                "oidc_issuer",
            )
    finally:
        stop_server(fresh)

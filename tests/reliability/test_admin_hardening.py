"""The admin surface over HTTP: wrong tokens are throttled per address, sign-out revokes the cookie on the server,
and /metrics is admin-only unless published on purpose. (Restarts and connection limits: test_connections.py.)"""

from __future__ import annotations

import pytest

from app.http.admin_auth import ADMIN_COOKIE
from tests.app.factories import make_client
from tests.reliability.helpers import peer

TOKEN = "adm-secret-0123456789"
KEY = "sk-alpha"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("admin"), api_keys=(KEY,), admin_token=TOKEN) as c:
        yield c


def sign_in(client, address: str) -> str:
    """Sign in from `address`; the admin cookie's value."""
    response = peer(client, client=(address, 4000)).post(
        "/admin/login", data={"token": TOKEN}, follow_redirects=False
    )
    assert response.status_code == 303, response.text
    return response.cookies[ADMIN_COOKIE]


def test_the_sign_in_form_makes_an_address_wait_after_five_wrong_tokens(keyed):
    attacker = peer(keyed, client=("203.0.113.50", 4000))
    for i in range(5):
        refused = attacker.post(
            "/admin/login", data={"token": f"guess-{i:02d}-0123456789"}, follow_redirects=False
        )
        assert refused.status_code == 403
    for token in ("guess-99-0123456789", TOKEN):  # while it waits, not even the right token is looked at
        waiting = attacker.post("/admin/login", data={"token": token}, follow_redirects=False)
        assert (waiting.status_code, waiting.headers["retry-after"]) == (429, "1")
        assert "too many wrong admin tokens from this address" in waiting.text
    header = attacker.get("/api/admin/state", headers={"x-admin-token": TOKEN})  # the header path waits too
    assert (header.status_code, header.json()["error"]["code"]) == (429, "too_many_attempts")
    assert sign_in(keyed, "203.0.113.51")  # another address is not held up


def test_sign_out_revokes_the_cookie_on_the_server(keyed):
    cookie = sign_in(keyed, "203.0.113.60")
    page = peer(keyed, client=("203.0.113.60", 4000), cookies={ADMIN_COOKIE: cookie})
    assert page.get("/admin").status_code == 200
    assert page.get("/api/admin/state").status_code == 200
    out = page.post("/admin/logout", follow_redirects=False)
    assert out.status_code == 303 and out.headers["set-cookie"].startswith(f"{ADMIN_COOKIE}=;")
    stolen = peer(
        keyed, client=("198.51.100.9", 4000), cookies={ADMIN_COOKIE: cookie}
    )  # a copy kept elsewhere
    assert stolen.get("/admin").status_code == 401
    assert stolen.get("/api/admin/state").status_code == 401


def test_metrics_need_the_admin_token_or_its_cookie(keyed):
    remote = peer(keyed, client=("203.0.113.70", 4000))
    assert remote.get("/metrics").status_code == 401
    assert keyed.get("/metrics").status_code == 401  # loopback is not enough once a token is set
    as_api_key = remote.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
    assert (as_api_key.status_code, as_api_key.json()["error"]["code"]) == (403, "invalid_admin_token")
    for headers in ({"x-admin-token": TOKEN}, {"authorization": f"Bearer {TOKEN}"}):
        response = remote.get("/metrics", headers=headers)
        assert response.status_code == 200 and "pagedchat:" in response.text
    cookie = sign_in(keyed, "203.0.113.71")
    assert (
        peer(keyed, client=("203.0.113.71", 4000), cookies={ADMIN_COOKIE: cookie}).get("/metrics").status_code
        == 200
    )


def test_metrics_without_a_token_are_for_loopback_unless_published(tmp_path):
    (tmp_path / "closed").mkdir()
    (tmp_path / "public").mkdir()
    with make_client(tmp_path / "closed") as closed:
        assert closed.get("/metrics").status_code == 200  # loopback, as the admin surface
        remote = peer(closed, client=("203.0.113.80", 4000)).get("/metrics")
        assert (remote.status_code, remote.json()["error"]["code"]) == (403, "admin_loopback_only")
    with make_client(tmp_path / "public", admin_token=TOKEN, metrics_public=True) as public:
        assert peer(public, client=("203.0.113.80", 4000)).get("/metrics").status_code == 200

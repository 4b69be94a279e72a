"""The mechanisms behind the Host check, the proxy rule and loopback admin, on an app that has not started (the
checks run before any route needs the engine), and the parsers of `next` and integer query parameters. The
attacks themselves run against real servers in tests/e2e/test_security_surface.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from app.accounts.routes import safe_next
from app.http.errors import APIError
from app.http.hosts import parse_host
from app.http.params import query_int
from app.http.server import exposure_warnings
from app.main import create_app
from app.settings import Settings
from tests.app.factories import LOOPBACK_CLIENT, make_settings, make_tiny_model_dir

REBIND = "rebind.attacker.example"


@contextlib.contextmanager
def started_app(tmp_path, **overrides) -> Iterator[TestClient]:
    """A TestClient from loopback on a started app (the tiny model)."""
    app = create_app(make_settings(tmp_path, make_tiny_model_dir(), **overrides))
    with TestClient(app, client=LOOPBACK_CLIENT) as client:
        yield client


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("localhost", "localhost"),
        ("LocalHost:8000", "localhost"),
        ("127.0.0.1:", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("localhost.", "localhost"),
        ("::1", None),  # an IPv6 Host needs its brackets
        ("[localhost]:80", None),
        ("[::1", None),
        ("host:80x", None),
        ("host:80:80", None),
        (":80", None),
        ("", None),
        (None, None),
    ],
)
def test_the_host_part_of_a_host_header(header, host):
    assert parse_host(header) == host


def test_allowed_hosts_add_to_the_servers_own_names():
    names = Settings(
        host="192.0.2.7", allowed_hosts=("chat.example.com,*.example.org", "[2001:db8::1]")
    ).allowed_host_names
    assert names == {
        "192.0.2.7",
        "localhost",
        "127.0.0.1",
        "::1",
        "chat.example.com",
        "*.example.org",
        "2001:db8::1",
    }
    assert "0.0.0.0" not in Settings(host="0.0.0.0").allowed_host_names  # no client names a wildcard address
    assert Settings(allowed_hosts=("*",)).any_host_allowed and not Settings().any_host_allowed


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"allowed_hosts": ("chat.example.com:443",)},
            "allowed_hosts: 'chat.example.com:443' is not a host name",
        ),
        ({"allowed_hosts": ("https://chat.example.com",)}, "allowed_hosts: 'https://chat.example.com'"),
        (
            {"forwarded_allow_ips": ("proxy.internal",)},
            "forwarded_allow_ips: 'proxy.internal' is not an IP address",
        ),
    ],
)
def test_bad_hosts_and_proxies_stop_the_start_naming_the_setting(values, message):
    with pytest.raises(ValueError, match=message):
        Settings(**values)


def test_every_route_refuses_a_host_it_does_not_answer(tmp_path):
    with started_app(tmp_path) as client:
        for path in ("/health", "/admin", "/static/login.js", "/nowhere"):
            refused = client.get(path, headers={"host": f"{REBIND}:8000"})
            assert refused.status_code == 400, path
            assert refused.json()["error"]["message"] == (
                f"Host '{REBIND}:8000' is not a host this server answers: add it to --allowed-hosts "
                "(PAGEDCHAT_ALLOWED_HOSTS) if clients reach the server by that name"
            )
            assert refused.headers["x-content-type-options"] == "nosniff"
        assert client.get("/admin", headers={"host": "localhost:8000"}).status_code == 200  # loopback admin


def test_a_wildcard_host_list_does_not_make_a_stranger_host_loopback_admin(tmp_path):
    with started_app(tmp_path, allowed_hosts=("testserver", "*")) as client:
        assert client.get("/static/login.js", headers={"host": REBIND}).status_code == 200  # answered: "*"
        refused = client.get("/api/admin/state", headers={"host": REBIND})
        assert (
            refused.status_code == 403
            and "--allowed-hosts '*' does not count" in refused.json()["error"]["message"]
        )
        assert client.get("/admin").status_code == 200  # Host testserver: listed by name


def test_a_connection_from_a_trusted_proxy_is_never_loopback(tmp_path):
    with started_app(tmp_path, forwarded_allow_ips=("127.0.0.0/8",)) as client:
        for headers in (
            {},
            {"x-forwarded-for": "127.0.0.1"},
        ):  # the proxy relays a local user, or sends no header
            refused = client.get("/api/admin/state", headers=headers)
            assert (refused.status_code, refused.json()["error"]["code"]) == (403, "admin_loopback_only")
            assert "through a proxy" in refused.json()["error"]["message"]


def test_the_admin_surface_is_said_to_be_open_only_without_token_and_accounts():
    assert any("the admin surface is open" in w for w in exposure_warnings(Settings()))
    assert exposure_warnings(Settings(admin_token="t" * 16)) == []
    assert exposure_warnings(Settings(auth="local")) == []
    assert any("DNS rebinding" in w for w in exposure_warnings(Settings(auth="local", allowed_hosts=("*",))))
    assert any("--allowed-hosts" in w for w in exposure_warnings(Settings(auth="local", host="0.0.0.0")))
    assert any(
        "X-Forwarded-For" in w for w in exposure_warnings(Settings(auth="local", forwarded_allow_ips=("*",)))
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/account?tab=keys#top", "/account?tab=keys#top"),
        ("/x:y", "/x:y"),
        ("/%09/evil.example", "/%09/evil.example"),  # encoded: a path segment, not a tab
        ("/\t/evil.example", "/"),
        ("/\r\n/evil.example", "/"),
        ("/\\evil.example", "/"),
        ("//evil.example", "/"),
        ("/ /evil.example", "/"),
        ("/\x00", "/"),
        ("/caf\u00e9", "/"),
        ("https://evil.example", "/"),
        ("javascript:alert(1)", "/"),
        ("evil.example", "/"),
        ("/" + "a" * 2000, "/"),
        ("", "/"),
        (None, "/"),
    ],
)
def test_next_is_a_path_of_this_site_or_ignored(value, expected):
    assert safe_next(value) == expected


@pytest.mark.parametrize("raw", ["²", "٣", " 7", "1_0", "+5", "-1", "0", "51", "9" * 40, ""])
def test_an_integer_query_parameter_names_itself_and_its_range(raw):
    with pytest.raises(APIError) as refused:
        query_int({"limit": raw}, "limit", 20, 1, 50)
    assert (refused.value.status, refused.value.param) == (400, "limit")
    assert refused.value.message == f"limit must be an integer from 1 to 50, got {raw[:40]!r}"


def test_an_integer_query_parameter_in_range_or_absent():
    assert query_int({"limit": "50"}, "limit", 20, 1, 50) == 50
    assert query_int({}, "limit", 20, 1, 50) == 20

"""The admin sign-in: constant-time token check, the signed admin cookie, and who gets through `check_admin`."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from itsdangerous import TimestampSigner
from starlette.requests import Request

from app.routes.admin_auth import (
    ADMIN_COOKIE,
    ADMIN_COOKIE_MAX_AGE_S,
    admin_cookie_header,
    admin_cookie_valid,
    check_admin,
    read_login_token,
    token_matches,
)
from app.services.errors import APIError
from app.settings import Settings

SETTINGS = Settings(secret_key="unit-secret", admin_token="adm-token-0123456789")


def make_request(
    *,
    cookie: str | None = None,
    client: str = "203.0.113.9",
    body: bytes = b"",
    content_type: str = "application/x-www-form-urlencoded",
) -> Request:
    """A request from `client` carrying an optional Cookie header and a body."""
    headers = [(b"content-type", content_type.encode())]
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/admin/login",
        "headers": headers,
        "client": (client, 5000),
    }
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    return Request(scope, receive)


def cookie_of(header: str) -> str:
    """The `name=value` pair of a Set-Cookie header."""
    return header.split(";", 1)[0]


def test_token_matches_only_the_configured_token():
    assert token_matches("adm-token-0123456789", SETTINGS)
    assert not token_matches("adm-token-0123456789 ", SETTINGS)
    assert not token_matches("", SETTINGS)
    assert not token_matches("", Settings(secret_key="unit-secret"))  # no token configured: nothing matches


def test_cookie_header_is_httponly_strict_and_never_holds_the_token():
    header = admin_cookie_header(SETTINGS)
    assert header.startswith(f"{ADMIN_COOKIE}=")
    assert header.endswith(f"; Path=/; Max-Age={ADMIN_COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Strict")
    assert "adm-token-0123456789" not in header
    secure = admin_cookie_header(dataclasses.replace(SETTINGS, cookie_secure=True))
    assert secure.endswith("; SameSite=Strict; Secure")
    assert admin_cookie_header(SETTINGS, clear=True) == (
        f"{ADMIN_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
    )


def test_cookie_is_valid_until_forged_rotated_or_expired(monkeypatch):
    cookie = cookie_of(admin_cookie_header(SETTINGS))
    assert admin_cookie_valid(make_request(cookie=cookie), SETTINGS)
    assert not admin_cookie_valid(make_request(cookie=cookie[:-2] + "xx"), SETTINGS)
    assert not admin_cookie_valid(make_request(), SETTINGS)
    rotated = dataclasses.replace(SETTINGS, admin_token="new-token-0123456789")
    assert not admin_cookie_valid(make_request(cookie=cookie), rotated)
    other_key = dataclasses.replace(SETTINGS, secret_key="other-secret")
    assert not admin_cookie_valid(make_request(cookie=cookie), other_key)
    monkeypatch.setattr(TimestampSigner, "get_timestamp", lambda self: 1_000_000)  # signed long ago
    old = cookie_of(admin_cookie_header(SETTINGS))
    monkeypatch.undo()
    assert not admin_cookie_valid(make_request(cookie=old), SETTINGS)


def test_check_admin_accepts_the_cookie_and_refuses_the_rest():
    cookie = cookie_of(admin_cookie_header(SETTINGS))
    check_admin(make_request(cookie=cookie), SETTINGS)  # from anywhere, with the cookie
    with pytest.raises(APIError) as missing:
        check_admin(make_request(client="127.0.0.1"), SETTINGS)  # a token is set: loopback is not enough
    assert missing.value.status == 401
    no_token = Settings(secret_key="unit-secret")
    check_admin(make_request(client="127.0.0.1"), no_token)
    with pytest.raises(APIError) as remote:
        check_admin(make_request(cookie=cookie), no_token)
    assert remote.value.status == 403


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b"token=adm-token", "application/x-www-form-urlencoded", "adm-token"),
        (b"token=a%20b+c&x=1", "application/x-www-form-urlencoded; charset=utf-8", "a b c"),
        (b"other=1", "application/x-www-form-urlencoded", ""),
        (b'{"token": "adm-token"}', "application/json", ""),
        (b"token=" + b"a" * 5000, "application/x-www-form-urlencoded", ""),  # over the 4 KiB limit
        (b"token=\xff\xfe", "application/x-www-form-urlencoded", ""),  # not UTF-8
    ],
)
def test_login_form_token(body, content_type, expected):
    request = make_request(body=body, content_type=content_type)
    assert asyncio.run(read_login_token(request)) == expected

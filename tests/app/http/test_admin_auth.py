"""The admin sign-in: constant-time token check, the signed admin cookie backed by a revocable row, who gets
through `check_admin`, and the wait imposed on an address that sends wrong tokens."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from itsdangerous import TimestampSigner
from starlette.requests import Request

from app.db import Store
from app.http.admin_auth import (
    ADMIN_COOKIE,
    ADMIN_COOKIE_MAX_AGE_S,
    admin_cookie_header,
    admin_cookie_valid,
    check_admin,
    read_login_token,
    sign_in,
    sign_out,
    token_matches,
)
from app.http.errors import APIError
from app.http.login_throttle import LoginThrottle
from app.settings import Settings

TOKEN = "adm-token-0123456789"
SETTINGS = Settings(secret_key="unit-secret", admin_token=TOKEN)


def make_request(
    *,
    cookie: str | None = None,
    client: str = "203.0.113.9",
    body: bytes = b"",
    content_type: str = "application/x-www-form-urlencoded",
    admin_token: str | None = None,
) -> Request:
    """A request from `client` carrying an optional Cookie header, X-Admin-Token header and a body."""
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", content_type.encode())]
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    if admin_token is not None:
        headers.append((b"x-admin-token", admin_token.encode()))
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


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    running = Store(f"sqlite:///{tmp_path / 'admin.db'}")
    await running.start()
    yield running
    await running.close()


def services(store: Store, settings: Settings = SETTINGS) -> SimpleNamespace:
    """What the admin checks use of the app's services."""
    return SimpleNamespace(
        settings=settings, store=store, admission=SimpleNamespace(login_throttle=LoginThrottle())
    )


def test_token_matches_only_the_configured_token():
    assert token_matches(TOKEN, SETTINGS)
    assert not token_matches(TOKEN + " ", SETTINGS)
    assert not token_matches("", SETTINGS)
    assert not token_matches("", Settings(secret_key="unit-secret"))  # no token configured: nothing matches


def test_a_short_admin_token_is_refused_naming_the_minimum():
    with pytest.raises(ValueError, match="admin_token must be at least 16 characters, got 6"):
        Settings(admin_token="abcdef")


def test_cookie_header_is_httponly_strict_and_never_holds_the_token():
    header = admin_cookie_header(SETTINGS, "a-random-secret")
    assert header.startswith(f"{ADMIN_COOKIE}=a-random-secret.")
    assert header.endswith(f"; Path=/; Max-Age={ADMIN_COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Strict")
    assert TOKEN not in header
    secure = admin_cookie_header(dataclasses.replace(SETTINGS, cookie_secure=True), "s")
    assert secure.endswith("; SameSite=Strict; Secure")
    assert admin_cookie_header(SETTINGS, clear=True) == (
        f"{ADMIN_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
    )


@pytest.mark.anyio
async def test_cookie_is_valid_until_forged_rotated_expired_or_signed_out(store, monkeypatch):
    svc = services(store)
    cookie = cookie_of(await sign_in(make_request(), svc))
    assert await admin_cookie_valid(make_request(cookie=cookie), svc)
    assert not await admin_cookie_valid(make_request(cookie=cookie[:-2] + "xx"), svc)
    assert not await admin_cookie_valid(make_request(), svc)
    rotated = services(store, dataclasses.replace(SETTINGS, admin_token="new-token-0123456789"))
    assert not await admin_cookie_valid(make_request(cookie=cookie), rotated)
    other_key = services(store, dataclasses.replace(SETTINGS, secret_key="other-secret"))
    assert not await admin_cookie_valid(make_request(cookie=cookie), other_key)
    monkeypatch.setattr(TimestampSigner, "get_timestamp", lambda self: 1_000_000)  # signed long ago
    old = cookie_of(await sign_in(make_request(), svc))
    monkeypatch.undo()
    assert not await admin_cookie_valid(make_request(cookie=old), svc)
    assert await sign_out(make_request(cookie=cookie), svc) is True
    assert not await admin_cookie_valid(make_request(cookie=cookie), svc)  # a copy of it is worthless now
    assert await sign_out(make_request(cookie=cookie), svc) is False


@pytest.mark.anyio
async def test_check_admin_accepts_the_cookie_and_refuses_the_rest(store):
    svc = services(store)
    cookie = cookie_of(await sign_in(make_request(), svc))
    await check_admin(make_request(cookie=cookie), svc)  # from anywhere, with the cookie
    await check_admin(make_request(admin_token=TOKEN), svc)  # or the token
    with pytest.raises(APIError) as missing:
        await check_admin(make_request(client="127.0.0.1"), svc)  # a token is set: loopback is not enough
    assert missing.value.status == 401
    no_token = services(store, Settings(secret_key="unit-secret"))
    await check_admin(make_request(client="127.0.0.1"), no_token)
    with pytest.raises(APIError) as remote:
        await check_admin(make_request(cookie=cookie), no_token)
    assert remote.value.status == 403


@pytest.mark.anyio
async def test_an_address_sending_wrong_tokens_must_wait_even_with_the_right_one(store):
    svc = services(store)
    for _ in range(5):
        with pytest.raises(APIError) as wrong:
            await check_admin(make_request(admin_token="wrong-token-0123456789"), svc)
        assert wrong.value.status == 403
    for token in ("wrong-token-0123456789", TOKEN):
        with pytest.raises(APIError) as waiting:
            await check_admin(make_request(admin_token=token), svc)
        assert (waiting.value.status, waiting.value.code) == (429, "too_many_attempts")
        assert waiting.value.headers == {"Retry-After": "1"}
    await check_admin(make_request(admin_token=TOKEN, client="198.51.100.4"), svc)  # another address
    cookie = cookie_of(await sign_in(make_request(), svc))
    await check_admin(make_request(cookie=cookie), svc)  # a signed-in page on that address still works
    await asyncio.sleep(1.05)
    await check_admin(make_request(admin_token=TOKEN), svc)  # waited: the right token gets in, and clears it
    with pytest.raises(APIError) as fresh:
        await check_admin(make_request(admin_token="wrong-token-0123456789"), svc)
    assert fresh.value.status == 403


def test_the_waits_double_up_to_a_ceiling_and_are_forgotten_after_an_hour():
    now = [0.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    waits = [throttle.failed("a") for _ in range(16)]
    assert waits == [0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]
    now[0] = 899.5
    with pytest.raises(APIError) as locked:
        throttle.check("a")
    assert locked.value.headers["Retry-After"] == "1"
    throttle.check("b")
    now[0] += 3601
    throttle.check("a")  # forgotten
    assert throttle.failed("a") == 0
    assert throttle.num_refused == 1


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

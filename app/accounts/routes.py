"""Accounts over HTTP (`--auth local|oidc`): the sign-in and account pages, sign-in/out and passwords as JSON, and
the admin's account management under /api/users (invites: app/accounts/invite_routes.py; API keys: app/accounts/key_routes.py).

Every write comes from this server's own pages (same origin, JSON body: app/http/csrf.py), the sign-in too (a
cross-site sign-in would put the victim's browser in the attacker's account). Password attempts (sign-in, password
change) are counted per client address and per account as they arrive, before their hash (app/http/
login_throttle.py); a browser that signed in to an account before is recognised by its device cookie
(app/http/sign_in_device.py) and is not held back by an attack on that account from elsewhere.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from app.accounts.service import AccountService, SignIn, accounts_of
from app.db import UserRecord
from app.http.account_auth import (
    require_account,
    require_account_admin,
    session_cookie_header,
    signed_in_account,
)
from app.http.csrf import check_browser_write
from app.http.error_handlers import error_response
from app.http.errors import APIError, from_exception
from app.http.hosts import client_address
from app.http.params import read_json_object
from app.http.services import Services, services
from app.http.sign_in_device import account_subject, device_cookie_header, known_device
from app.http.templates import NO_STORE, templates

logger = logging.getLogger(__name__)
MAX_ACCOUNT_BODY_BYTES = 16 * 1024
MAX_NEXT_CHARS = 2000
SAME_SITE_PATH = re.compile(
    r"/[\x21-\x5b\x5d-\x7e]*"
)  # "/" then printable ASCII, no space, no backslash (\x5c)
# `/login?error=<code>`: the page shows the code's own message, never text from the URL
LOGIN_ERRORS = {
    "session_ended": "Your sign-in has ended (signed out, expired, or changed by an admin): sign in again.",
}
Handler = Callable[[Request, Services, AccountService], Awaitable[Response]]


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path of this site, else `/`. Only printable ASCII without a backslash: a
    browser drops tabs and newlines from a URL (`/<tab>/host` becomes `//host`, another site) and reads a backslash
    as `/`; and nothing a URL parser reads with a scheme or a host (`//host`, `http:...`)."""
    if not value or len(value) > MAX_NEXT_CHARS or not SAME_SITE_PATH.fullmatch(value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or value.startswith("//"):
        return "/"
    return value


def user_json(user: UserRecord) -> dict[str, Any]:
    """An account as the API shows it."""
    return {
        "id": user.id,
        "username": user.username,
        "role": user.role,
        "created_at": user.created_at.isoformat(),
        "disabled": user.disabled,
        "password": user.has_password,
        "oidc": user.oidc_issuer is not None,
    }


def _json_api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Accounts on (404 otherwise), writes from this server's pages only, failures as OpenAI-shaped errors."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        svc = services(request)
        try:
            if svc.settings.auth == "none":
                raise APIError(
                    404,
                    "accounts are off on this server: start it with --auth local (or oidc)",
                    code="accounts_off",
                )
            check_browser_write(request, svc.settings)
            return await handler(request, svc, accounts_of(svc))
        except Exception as exc:  # noqa: BLE001 - every failure becomes an API error
            return error_response(from_exception(exc))

    return endpoint


def signed_in_response(svc: Services, sign_in: SignIn, body: dict[str, Any], status: int = 200) -> Response:
    """A JSON answer that sets the new sign-in's cookie."""
    response = JSONResponse({"user": user_json(sign_in.user), **body}, status_code=status, headers=NO_STORE)
    response.headers.append("Set-Cookie", session_cookie_header(svc.settings, sign_in.secret))
    return response


async def _body(request: Request) -> dict[str, Any]:
    return await read_json_object(request, MAX_ACCOUNT_BODY_BYTES)


# ---- sign-in, sign-out, passwords --------------------------------------------------------------------------------
@_json_api
async def login(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /auth/login {username, password, next?}: sets the session cookie; 401 for a wrong pair, 429 while the
    address (or, from a device that never signed in to it, the account) must wait after too many."""
    address = client_address(request)
    body = await _body(request)
    username = body.get("username")
    subject = account_subject(username)
    device = known_device(request, svc.settings, subject)
    with svc.admission.password_throttle.begin(address, subject, device=device) as attempt:
        try:
            sign_in = await accounts.sign_in(
                username, body.get("password"), address, known_device=device is not None
            )
        except APIError as exc:
            if exc.status == 401:
                wait_s = attempt.failed()
                logger.warning(
                    "wrong password from %s%s", address, f"; it must wait {wait_s:g} s" if wait_s else ""
                )
            raise
        attempt.succeeded()
    response = signed_in_response(svc, sign_in, {"next": safe_next(body.get("next"))})
    if subject is not None:
        response.headers.append("Set-Cookie", device_cookie_header(svc.settings, subject, device))
    return response


@_json_api
async def logout(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /auth/logout: ends the sign-in on the server and clears the cookie (204 even when not signed in)."""
    account = signed_in_account(request)
    if account is not None:
        await accounts.sign_out(account)
    response = Response(status_code=204, headers=NO_STORE)
    response.headers.append("Set-Cookie", session_cookie_header(svc.settings, clear=True))
    return response


@_json_api
async def me(request: Request, svc: Services, accounts: AccountService) -> Response:
    """GET /auth/me: the signed-in account."""
    return JSONResponse({"user": user_json(require_account(request).user), "auth": svc.settings.auth})


@_json_api
async def change_password(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /auth/password {current_password, new_password}: ends every sign-in of the account (other devices
    sign in again) and signs this browser in afresh. A wrong current password counts as a wrong sign-in (a stolen
    cookie is no way around the throttle)."""
    account = require_account(request, "changing a password")
    address = client_address(request)
    body = await _body(request)
    subject = account_subject(account.user.username)
    device = known_device(request, svc.settings, subject)
    with svc.admission.password_throttle.begin(address, subject, device=device) as attempt:
        try:
            sign_in = await accounts.change_password(
                account,
                body.get("current_password"),
                body.get("new_password"),
                address,
                known_device=device is not None,
            )
        except APIError as exc:
            if exc.status == 403 and exc.code == "invalid_credentials":
                wait_s = attempt.failed()
                logger.warning(
                    "wrong current password from %s%s",
                    address,
                    f"; it must wait {wait_s:g} s" if wait_s else "",
                )
            raise
        attempt.succeeded()
    response = signed_in_response(svc, sign_in, {})
    if subject is not None:
        response.headers.append("Set-Cookie", device_cookie_header(svc.settings, subject, device))
    return response


# ---- the admin's account management ------------------------------------------------------------------------------
@_json_api
async def list_users(request: Request, svc: Services, accounts: AccountService) -> Response:
    """GET /api/users (admin)."""
    require_account_admin(request)
    return JSONResponse({"users": [user_json(u) for u in await accounts.store.accounts.list_users()]})


@_json_api
async def create_user(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /api/users {username, password, role?} (admin)."""
    require_account_admin(request)
    body = await _body(request)
    user = await accounts.create_user(body.get("username"), body.get("password"), body.get("role"))
    return JSONResponse({"user": user_json(user)}, status_code=201)


@_json_api
async def update_user(request: Request, svc: Services, accounts: AccountService) -> Response:
    """PATCH /api/users/{user_id} {role?, disabled?} (admin): disabling ends the account's sign-ins."""
    require_account_admin(request)
    body = await _body(request)
    user = await accounts.update_user(request.path_params["user_id"], body.get("role"), body.get("disabled"))
    return JSONResponse({"user": user_json(user)})


@_json_api
async def delete_user(request: Request, svc: Services, accounts: AccountService) -> Response:
    """DELETE /api/users/{user_id} (admin): the account, its sign-ins, its chats and its cached blocks go."""
    require_account_admin(request)
    purged = await accounts.delete_user(request.path_params["user_id"])
    return JSONResponse(
        {"deleted": True, "purged_ram_blocks": purged.ram_blocks, "purged_disk_blocks": purged.disk_blocks}
    )


# ---- pages ---------------------------------------------------------------------------------------------------------
def _page(request: Request, name: str, context: dict[str, Any]) -> Response:
    return templates.TemplateResponse(request, name, context, headers=NO_STORE)


async def login_page(request: Request) -> Response:
    """GET /login: the sign-in page (signed in already: on to `next`)."""
    svc = services(request)
    next_path = safe_next(request.query_params.get("next"))
    if svc.settings.auth == "none" or signed_in_account(request) is not None:
        return RedirectResponse(next_path, status_code=303, headers=NO_STORE)
    error = LOGIN_ERRORS.get(request.query_params.get("error", ""), "")  # an unknown code shows nothing
    return _page(request, "login.html", {"oidc": svc.settings.auth == "oidc", "error": error})


async def account_page(request: Request) -> Response:
    """GET /account: the signed-in account's page (password, sign-out; accounts management for admins)."""
    svc = services(request)
    if svc.settings.auth == "none":
        return RedirectResponse("/", status_code=303)
    account = signed_in_account(request)
    if account is None:
        return RedirectResponse("/login?next=/account", status_code=303, headers=NO_STORE)
    return _page(request, "account.html", {"user": account.user})


routes = [
    Route("/login", login_page, methods=["GET"]),
    Route("/account", account_page, methods=["GET"]),
    Route("/auth/login", login, methods=["POST"]),
    Route("/auth/logout", logout, methods=["POST"]),
    Route("/auth/me", me, methods=["GET"]),
    Route("/auth/password", change_password, methods=["POST"]),
    Route("/api/users", list_users, methods=["GET"]),
    Route("/api/users", create_user, methods=["POST"]),
    Route("/api/users/{user_id}", update_user, methods=["PATCH"]),
    Route("/api/users/{user_id}", delete_user, methods=["DELETE"]),
]

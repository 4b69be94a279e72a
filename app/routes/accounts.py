"""Accounts over HTTP (`--auth local|oidc`): the sign-in, invite and account pages, sign-in/out and passwords as
JSON, and the admin's account management under /api/users.

Every write comes from this server's own pages (same origin, JSON body: app/routes/csrf.py), the sign-in too (a
cross-site sign-in would put the victim's browser in the attacker's account). Password attempts (sign-in, password
change) are counted per client address and per account as they arrive, before their hash (app/services/
login_throttle.py); a browser that signed in to an account before is recognised by its device cookie
(app/routes/sign_in_device.py) and is not held back by an attack on that account from elsewhere.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from app.db import UserRecord
from app.routes.account_auth import (
    require_account,
    require_account_admin,
    session_cookie_header,
    signed_in_account,
)
from app.routes.context import Services, services
from app.routes.csrf import check_browser_write
from app.routes.errors import error_response
from app.routes.pages import NO_STORE, templates
from app.routes.params import read_json_object
from app.routes.sign_in_device import account_subject, device_cookie_header, known_device
from app.services.accounts import AccountService, SignIn
from app.services.errors import APIError, from_exception

logger = logging.getLogger(__name__)
MAX_ACCOUNT_BODY_BYTES = 16 * 1024
Handler = Callable[[Request, Services, AccountService], Awaitable[Response]]


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path of this site (never `//host` or a URL elsewhere), default `/`."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def client_address(request: Request) -> str:
    """The peer's address (what sign-ins record and throttling counts)."""
    return request.client.host if request.client else "unknown"


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
            if svc.accounts is None:
                raise APIError(503, "the service is still starting", headers={"Retry-After": "2"})
            check_browser_write(request, svc.settings)
            return await handler(request, svc, svc.accounts)
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
    with svc.password_throttle.begin(address, subject, device=device) as attempt:
        try:
            sign_in = await accounts.sign_in(username, body.get("password"), address)
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
    with svc.password_throttle.begin(address, subject, device=device) as attempt:
        try:
            sign_in = await accounts.change_password(
                account, body.get("current_password"), body.get("new_password"), address
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


@_json_api
async def check_invite(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /auth/invite {token}: whom the invite is for (the token travels in the body, never in a URL)."""
    invite = await accounts.invite_for((await _body(request)).get("token"))
    return JSONResponse(
        {"username": invite.username, "role": invite.role, "expires_at": invite.expires_at.isoformat()},
        headers=NO_STORE,
    )


@_json_api
async def accept_invite(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /auth/invite/accept {token, password}: creates the invited account and signs this browser in."""
    body = await _body(request)
    sign_in = await accounts.accept_invite(body.get("token"), body.get("password"), client_address(request))
    return signed_in_response(svc, sign_in, {"next": "/"}, status=201)


# ---- the admin's account management ------------------------------------------------------------------------------
@_json_api
async def list_users(request: Request, svc: Services, accounts: AccountService) -> Response:
    """GET /api/users (admin)."""
    require_account_admin(request)
    return JSONResponse({"users": [user_json(u) for u in await accounts.store.list_users()]})


@_json_api
async def create_user(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /api/users {username, password, role?} (admin)."""
    require_account_admin(request)
    body = await _body(request)
    user = await accounts.create_user(body.get("username"), body.get("password"), body.get("role"))
    return JSONResponse({"user": user_json(user)}, status_code=201)


@_json_api
async def create_invite(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /api/users/invites {username, role?} (admin): a one-time link; the invitee sets the password."""
    admin = require_account_admin(request)
    body = await _body(request)
    token, invite = await accounts.invite(admin, body.get("username"), body.get("role"))
    path = f"/invite#{token}"  # a fragment: the token reaches no server log and no Referer
    return JSONResponse(
        {
            "username": invite.username,
            "role": invite.role,
            "expires_at": invite.expires_at.isoformat(),
            "path": path,
            "url": str(request.base_url).rstrip("/") + path,
        },
        status_code=201,
        headers=NO_STORE,
    )


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
    error = request.query_params.get("error", "")[
        :300
    ]  # a refused provider sign-in comes back with its reason
    return _page(request, "login.html", {"oidc": svc.settings.auth == "oidc", "error": error})


async def invite_page(request: Request) -> Response:
    """GET /invite#<token>: the invitee sets a password (the page reads the token from the fragment)."""
    if services(request).settings.auth == "none":
        return RedirectResponse("/", status_code=303)
    return _page(request, "invite.html", {})


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
    Route("/invite", invite_page, methods=["GET"]),
    Route("/account", account_page, methods=["GET"]),
    Route("/auth/login", login, methods=["POST"]),
    Route("/auth/logout", logout, methods=["POST"]),
    Route("/auth/me", me, methods=["GET"]),
    Route("/auth/password", change_password, methods=["POST"]),
    Route("/auth/invite", check_invite, methods=["POST"]),
    Route("/auth/invite/accept", accept_invite, methods=["POST"]),
    Route("/api/users", list_users, methods=["GET"]),
    Route("/api/users", create_user, methods=["POST"]),
    Route("/api/users/invites", create_invite, methods=["POST"]),
    Route("/api/users/{user_id}", update_user, methods=["PATCH"]),
    Route("/api/users/{user_id}", delete_user, methods=["DELETE"]),
]

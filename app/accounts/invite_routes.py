"""Invites over HTTP (`--auth local|oidc`): an admin makes a one-time link, lists and revokes the pending ones; the
invitee's page checks the link and sets the password.

An invite lives while its creator is an enabled admin (app/db/account_invites.py): one made by an admin who was
demoted, disabled or deleted since is refused at acceptance (404), in the transaction that would create the account.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from app.accounts.routes import _body, _json_api, _page, client_address, signed_in_response
from app.accounts.service import AccountService
from app.db import InviteRecord
from app.http.account_auth import require_account_admin
from app.http.services import Services, services
from app.http.templates import NO_STORE


def invite_json(invite: InviteRecord) -> dict[str, Any]:
    """A pending invite as an admin sees it (its id is the token's SHA-256: it accepts nothing)."""
    return {
        "id": invite.id,
        "username": invite.username,
        "role": invite.role,
        "created_by": invite.created_by,
        "created_at": invite.created_at.isoformat(),
        "expires_at": invite.expires_at.isoformat(),
    }


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


@_json_api
async def create_invite(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /api/users/invites {username, role?} (admin): a one-time link; the invitee sets the password."""
    admin = require_account_admin(request)
    body = await _body(request)
    token, invite = await accounts.invite(admin, body.get("username"), body.get("role"))
    path = f"/invite#{token}"  # a fragment: the token reaches no server log and no Referer
    return JSONResponse(
        {
            **invite_json(invite),
            "path": path,
            "url": str(request.base_url).rstrip("/") + path,
        },
        status_code=201,
        headers=NO_STORE,
    )


@_json_api
async def list_invites(request: Request, svc: Services, accounts: AccountService) -> Response:
    """GET /api/users/invites (admin): the pending invites, soonest to expire first."""
    require_account_admin(request)
    invites = await accounts.store.accounts.list_invites()
    return JSONResponse({"invites": [invite_json(i) for i in invites]}, headers=NO_STORE)


@_json_api
async def revoke_invite(request: Request, svc: Services, accounts: AccountService) -> Response:
    """DELETE /api/users/invites/{invite_id} (admin): the link stops working; 404 when no such invite is pending."""
    require_account_admin(request)
    await accounts.revoke_invite(request.path_params["invite_id"])
    return Response(status_code=204, headers=NO_STORE)


async def invite_page(request: Request) -> Response:
    """GET /invite#<token>: the invitee sets a password (the page reads the token from the fragment)."""
    if services(request).settings.auth == "none":
        return RedirectResponse("/", status_code=303)
    return _page(request, "invite.html", {})


routes = [
    Route("/invite", invite_page, methods=["GET"]),
    Route("/auth/invite", check_invite, methods=["POST"]),
    Route("/auth/invite/accept", accept_invite, methods=["POST"]),
    Route("/api/users/invites", list_invites, methods=["GET"]),
    Route("/api/users/invites", create_invite, methods=["POST"]),
    Route("/api/users/invites/{invite_id}", revoke_invite, methods=["DELETE"]),
]

"""An account's own API keys over HTTP (`--auth local|oidc`): GET /api/keys, POST /api/keys {name}, DELETE
/api/keys/{key_id}.

Managed with the account's sign-in (its cookie: the /account page, or a script that signed in at /auth/login), never
with a key: a stolen key cannot mint itself successors nor revoke its owner's other keys. A key is shown once, in
the answer of the POST that made it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.accounts.routes import _body, _json_api
from app.accounts.service import AccountService
from app.db import ApiKeyRecord
from app.http.account_auth import require_account
from app.http.errors import APIError
from app.http.identity import Account
from app.http.key_auth import sent_key
from app.http.services import Services
from app.http.templates import NO_STORE


def key_json(key: ApiKeyRecord) -> dict[str, Any]:
    """A key as its account sees it listed (never its secret)."""
    return {"id": key.id, "name": key.name, "prefix": key.prefix, "created_at": key.created_at.isoformat()}


def _signed_in(request: Request) -> Account:
    if sent_key(request):
        raise APIError(
            403,
            "API keys are managed with the account's sign-in (the /account page), not with an API key",
            code="api_key_not_allowed",
        )
    return require_account(request, "managing API keys")


@_json_api
async def list_keys(request: Request, svc: Services, accounts: AccountService) -> Response:
    """GET /api/keys: the account's live keys, oldest first."""
    account = _signed_in(request)
    keys = await accounts.keys.list_keys(account.user)
    return JSONResponse({"keys": [key_json(k) for k in keys]}, headers=NO_STORE)


@_json_api
async def create_key(request: Request, svc: Services, accounts: AccountService) -> Response:
    """POST /api/keys {name}: a new key, its secret in `key` (shown this once)."""
    account = _signed_in(request)
    new = await accounts.keys.create(account.user, (await _body(request)).get("name"))
    return JSONResponse({**key_json(new.record), "key": new.secret}, status_code=201, headers=NO_STORE)


@_json_api
async def revoke_key(request: Request, svc: Services, accounts: AccountService) -> Response:
    """DELETE /api/keys/{key_id}: the key stops working now and what it runs ends (`ended`: how many requests)."""
    account = _signed_in(request)
    num_ended = await accounts.keys.revoke(account.user, request.path_params["key_id"])
    return JSONResponse({"revoked": True, "ended": num_ended}, headers=NO_STORE)


routes = [
    Route("/api/keys", list_keys, methods=["GET"]),
    Route("/api/keys", create_key, methods=["POST"]),
    Route("/api/keys/{key_id}", revoke_key, methods=["DELETE"]),
]

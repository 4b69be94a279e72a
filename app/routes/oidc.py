"""OpenID Connect sign-in (`--auth oidc`) through authlib's Starlette client: the authorization code flow with PKCE
(S256), `state` and `nonce`, the provider found by discovery (`<issuer>/.well-known/openid-configuration`).

authlib keeps the flow's state, nonce and PKCE verifier in a short-lived signed cookie (Starlette's session, scoped to
/auth/oidc), checks `state` on the way back, and validates the ID token: its signature against the provider's JWKS,
`iss`, `aud` (our client id), `exp`, `iat` and the `nonce`. An identity signs in as the account keyed by its
(issuer, subject), made on its first sign-in. A refused sign-in shows the sign-in page with the reason.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.starlette_client import OAuth
from joserfc.errors import JoseError
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from app.routes.account_auth import session_cookie_header
from app.routes.accounts import client_address, safe_next
from app.routes.context import services
from app.routes.pages import NO_STORE, templates
from app.services.errors import from_exception
from app.settings import Settings

logger = logging.getLogger(__name__)
PROVIDER = "oidc"
CALLBACK_PATH = "/auth/oidc/callback"
FLOW_COOKIE = "pagedchat_oidc"
FLOW_MAX_AGE_S = 600  # a sign-in at the provider must come back within this
PROVIDER_TIMEOUT_S = 10.0
# error codes a refusal may name on the page: OAuth 2.0's (RFC 6749 4.1.2.1), OpenID Connect's (Core 3.1.2.6) and
# authlib's own. A callback's `error` and `error_description` are anyone's to write into a link: an unknown code is
# not shown, and no description ever is (the log has it)
SHOWN_ERRORS = frozenset(
    {
        "invalid_request",
        "unauthorized_client",
        "access_denied",
        "unsupported_response_type",
        "invalid_scope",
        "server_error",
        "temporarily_unavailable",
        "interaction_required",
        "login_required",
        "account_selection_required",
        "consent_required",
        "invalid_request_uri",
        "invalid_request_object",
        "request_not_supported",
        "request_uri_not_supported",
        "registration_not_supported",
        "oauth_error",
        "mismatching_state",
        "missing_token",
        "token_expired",
        "token_invalid",
    }
)


class SignInRefused(Exception):
    """The provider's answer does not sign anyone in; the message says why."""


def make_oauth(settings: Settings) -> OAuth:
    """authlib's client registry with the one provider of the settings."""
    oauth = OAuth()
    client_kwargs: dict[str, Any] = {
        "scope": settings.oidc_scopes,
        "code_challenge_method": "S256",
        "timeout": PROVIDER_TIMEOUT_S,
    }
    if not settings.oidc_client_secret:  # a public client: PKCE alone proves the code is ours
        client_kwargs["token_endpoint_auth_method"] = "none"
    oauth.register(
        PROVIDER,
        client_id=settings.oidc_client_id,
        client_secret=settings.oidc_client_secret or None,
        server_metadata_url=settings.oidc_issuer.rstrip("/") + "/.well-known/openid-configuration",
        client_kwargs=client_kwargs,
    )
    return oauth


def flow_middleware(settings: Settings) -> Middleware:
    """The signed cookie that carries one sign-in's state, nonce and PKCE verifier between the two redirects."""
    return Middleware(
        SessionMiddleware,
        secret_key=settings.secret_key,
        session_cookie=FLOW_COOKIE,
        max_age=FLOW_MAX_AGE_S,
        path="/auth/oidc",
        same_site="lax",  # the provider's redirect back is a cross-site top-level GET
        https_only=settings.cookie_secure,
    )


def _client(request: Request) -> Any:
    return request.app.state.oidc.create_client(PROVIDER)


def _callback_url(request: Request, settings: Settings) -> str:
    scheme = "https" if settings.cookie_secure else request.url.scheme
    return f"{scheme}://{request.headers.get('host', request.url.netloc)}{CALLBACK_PATH}"


async def _check_issuer(client: Any, settings: Settings) -> None:
    """Discovery must name the issuer we were configured with (OpenID Connect Discovery 1.0, section 4.3)."""
    try:
        metadata = await client.load_server_metadata()
    except httpx.HTTPError as exc:
        raise SignInRefused(
            f"the OpenID Connect provider cannot be reached at {settings.oidc_issuer}: {exc}"
        ) from None
    issuer = str(metadata.get("issuer", ""))
    if issuer.rstrip("/") != settings.oidc_issuer.rstrip("/"):
        raise SignInRefused(
            f"the provider's discovery document names the issuer {issuer[:200]!r}, not the configured "
            f"{settings.oidc_issuer!r}"
        )


def _refused(request: Request, message: str, status: int = 401) -> Response:
    logger.warning("OpenID Connect sign-in refused: %s", message)
    context = {"oidc": True, "error": f"Sign-in through the provider was refused: {message}"}
    return templates.TemplateResponse(request, "login.html", context, status_code=status, headers=NO_STORE)


async def oidc_login(request: Request) -> Response:
    """GET /auth/oidc/login?next=/path: off to the provider's authorization endpoint."""
    svc = services(request)
    if svc.settings.auth != "oidc":
        return RedirectResponse("/login", status_code=303)
    client = _client(request)
    try:
        await _check_issuer(client, svc.settings)
    except SignInRefused as exc:
        return _refused(request, str(exc), 502)
    request.session["next"] = safe_next(request.query_params.get("next"))
    return await client.authorize_redirect(request, _callback_url(request, svc.settings))


async def oidc_callback(request: Request) -> Response:
    """GET /auth/oidc/callback?code&state: the code for tokens, the ID token checked, the account signed in."""
    svc = services(request)
    if svc.settings.auth != "oidc" or svc.accounts is None:
        return RedirectResponse("/login", status_code=303)
    try:
        claims = await _verified_claims(request, svc.settings)
        user = await svc.accounts.oidc_account(claims["iss"], claims["sub"], claims)
        sign_in = await svc.accounts.start_session(user, client_address(request))
    except SignInRefused as exc:
        return _refused(request, str(exc))
    except Exception as exc:  # noqa: BLE001 - a disabled account (403), the database (503): shown, not raised
        error = from_exception(exc)
        return _refused(request, error.message, error.status)
    logger.info("signed in %r through OpenID Connect", user.username)
    response = RedirectResponse(
        safe_next(request.session.pop("next", None)), status_code=303, headers=NO_STORE
    )
    response.headers.append("Set-Cookie", session_cookie_header(svc.settings, sign_in.secret))
    return response


async def _verified_claims(request: Request, settings: Settings) -> dict[str, Any]:
    """The ID token's claims once authlib has checked state, exchanged the code and validated the token."""
    client = _client(request)
    try:
        issuer = (await client.load_server_metadata())["issuer"]  # checked against the settings at login
        # authlib checks iss only when given no options, and aud only through azp: name both (RFC 7519 4.1.1/3)
        claims_options = {
            "iss": {"essential": True, "values": [issuer]},
            "aud": {"essential": True, "values": [settings.oidc_client_id]},
            "sub": {"essential": True},
        }
        token = await client.authorize_access_token(request, claims_options=claims_options)
    except JoseError as exc:  # signature, iss, aud, exp, nonce
        raise SignInRefused(
            f"the provider's ID token is not valid ({exc.error}: {exc.description})"
        ) from None
    except AuthlibBaseError as exc:  # the provider's error (from the callback's URL), a mismatching state
        logger.warning(
            "OpenID Connect callback error %r: %r", str(exc.error)[:100], str(exc.description)[:300]
        )
        shown = exc.error if exc.error in SHOWN_ERRORS else "an error code it does not know"
        raise SignInRefused(f"{shown} (the server's log has the details)") from None
    except httpx.HTTPStatusError as exc:  # the token endpoint said no: its OAuth error, where it gives one
        raise SignInRefused(
            f"the provider's token endpoint refused the code: {_oauth_error(exc.response)}"
        ) from None
    except httpx.HTTPError as exc:
        raise SignInRefused(f"the provider's token endpoint cannot be reached: {exc}") from None
    claims = token.get("userinfo")
    if not claims:  # authlib validates an ID token only when one comes: none is no sign-in
        raise SignInRefused("the provider's token response holds no ID token (is the openid scope granted?)")
    return dict(claims)


def _oauth_error(response: httpx.Response) -> str:
    """`error: error_description` of an OAuth error response, else its status."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("error"):
        return f"{body['error']}: {body.get('error_description') or 'no description'}"[:300]
    return f"HTTP {response.status_code}"


routes = [
    Route("/auth/oidc/login", oidc_login, methods=["GET"]),
    Route(CALLBACK_PATH, oidc_callback, methods=["GET"]),
]

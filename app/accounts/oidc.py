"""OpenID Connect sign-in (`--auth oidc`) through authlib's Starlette client: the authorization code flow with PKCE
(S256), `state` and `nonce`, the provider found by discovery (`<issuer>/.well-known/openid-configuration`).

authlib keeps the flow's state, nonce and PKCE verifier in a short-lived signed cookie (scoped to /auth/oidc). The
callback checks, in order: discovery names the configured issuer; the `state` is this browser's and unused (spent
states are remembered while the cookie is valid: it could be sent again); an `error` from the provider; the code's
exchange; the ID token (an asymmetric alg, a key of the JWKS, the issuer, us as the only audience and azp if any,
`exp`, `iat` not ahead, our `nonce`). An identity signs in as the account keyed by its (issuer, subject), made on
its first sign-in. A refused sign-in shows the sign-in page with the reason (a code from REFUSALS).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.starlette_client import OAuth
from joserfc.errors import JoseError
from joserfc.jws import extract_compact
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from app.accounts.routes import client_address, safe_next
from app.accounts.service import accounts_of
from app.http.account_auth import session_cookie_header
from app.http.errors import from_exception
from app.http.services import services
from app.http.templates import NO_STORE, templates
from app.settings import Settings

logger = logging.getLogger(__name__)
PROVIDER = "oidc"
CALLBACK_PATH = "/auth/oidc/callback"
FLOW_COOKIE = "pagedchat_oidc"
FLOW_MAX_AGE_S = 600  # a sign-in at the provider must come back within this
PROVIDER_TIMEOUT_S = 10.0
# Our keys come from the provider's JWKS, public keys: an HS* token would be keyed with public material (the "alg
# confusion" forgery) and `none` is unsigned, whatever the discovery document advertises.
ID_TOKEN_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# Why a sign-in was refused: the code (logged, and what a page or a redirect can name) and its HTTP status.
REFUSALS: dict[str, int] = {
    "oidc_unreachable": 502,  # discovery cannot be read
    "oidc_issuer": 502,  # discovery names another issuer than the configured one
    "oidc_state": 401,  # the callback's state is not this browser's, already used, or expired
    "oidc_provider_error": 401,  # the provider answered with an error (access_denied, ...)
    "oidc_token_endpoint": 401,  # the code's exchange failed
    "oidc_no_id_token": 401,  # the token response holds no ID token
    "oidc_algorithm": 401,  # the ID token is not signed with an algorithm of ID_TOKEN_ALGS
    "oidc_id_token": 401,  # signature, iss, aud, azp, exp, iat or nonce
    "oidc_audience": 401,  # the ID token names other audiences besides us
}

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
    """The provider's answer does not sign anyone in: `code` (a key of REFUSALS) and what exactly was wrong."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


class SpentStates:
    """The states of callbacks already handled, remembered while their flow cookie is valid: the signed cookie can be
    sent again with the same callback URL, so a state is single-use only if the server remembers it."""

    def __init__(self, ttl_s: float = FLOW_MAX_AGE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s, self._clock = ttl_s, clock
        self._until: OrderedDict[str, float] = OrderedDict()  # in spending order, so oldest first

    def spend(self, state: str) -> bool:
        """True the first time `state` is spent; False while it is remembered (no await: atomic on the loop)."""
        now = self._clock()
        while self._until and next(iter(self._until.values())) <= now:
            self._until.popitem(last=False)
        if state in self._until:
            return False
        self._until[state] = now + self._ttl_s
        return True

    def __len__(self) -> int:
        return len(self._until)


@dataclass
class OidcClient:
    """authlib's client registry with the one provider, and the states its callbacks have spent."""

    oauth: OAuth
    spent: SpentStates = field(default_factory=SpentStates)


def make_oauth(settings: Settings) -> OidcClient:
    """The OpenID Connect client of the settings' provider (app.state.oidc)."""
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
    return OidcClient(oauth)


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
    return request.app.state.oidc.oauth.create_client(PROVIDER)


def _callback_url(request: Request, settings: Settings) -> str:
    scheme = "https" if settings.cookie_secure else request.url.scheme
    return f"{scheme}://{request.headers.get('host', request.url.netloc)}{CALLBACK_PATH}"


async def _issuer(client: Any, settings: Settings) -> str:
    """The issuer of the discovery document, which must be the configured one (OpenID Connect Discovery 1.0, 4.3);
    checked at the callback too: it may be the first request of this process to read it (a restart mid-sign-in)."""
    try:
        metadata = await client.load_server_metadata()
    except httpx.HTTPError as exc:
        raise SignInRefused(
            "oidc_unreachable",
            f"the OpenID Connect provider cannot be reached at {settings.oidc_issuer}: {exc}",
        ) from None
    issuer = str(metadata.get("issuer", ""))
    if issuer.rstrip("/") != settings.oidc_issuer.rstrip("/"):
        raise SignInRefused(
            "oidc_issuer",
            f"the provider's discovery document names the issuer {issuer[:200]!r}, not the configured "
            f"{settings.oidc_issuer!r}",
        )
    return issuer


def _refused(request: Request, refusal: SignInRefused, status: int | None = None) -> Response:
    logger.warning("OpenID Connect sign-in refused (%s): %s", refusal.code, refusal.detail)
    context = {"oidc": True, "error": f"Sign-in through the provider was refused: {refusal.detail}"}
    return templates.TemplateResponse(
        request,
        "login.html",
        context,
        status_code=status or REFUSALS.get(refusal.code, 401),
        headers=NO_STORE,
    )


async def oidc_login(request: Request) -> Response:
    """GET /auth/oidc/login?next=/path: off to the provider's authorization endpoint."""
    svc = services(request)
    if svc.settings.auth != "oidc":
        return RedirectResponse("/login", status_code=303)
    client = _client(request)
    try:
        await _issuer(client, svc.settings)
    except SignInRefused as exc:
        return _refused(request, exc)
    request.session["next"] = safe_next(request.query_params.get("next"))
    return await client.authorize_redirect(request, _callback_url(request, svc.settings))


async def oidc_callback(request: Request) -> Response:
    """GET /auth/oidc/callback?code&state: the code for tokens, the ID token checked, the account signed in."""
    svc = services(request)
    if svc.settings.auth != "oidc" or svc.accounts is None:
        return RedirectResponse("/login", status_code=303)
    try:
        claims = await _verified_claims(request, svc.settings)
        accounts = accounts_of(svc)
        user = await accounts.oidc_account(claims["iss"], claims["sub"], claims)
        sign_in = await accounts.start_session(user, client_address(request))
    except SignInRefused as exc:
        return _refused(request, exc)
    except Exception as exc:  # noqa: BLE001 - a disabled account (403), the database (503): shown, not raised
        error = from_exception(exc)
        return _refused(request, SignInRefused(error.code or "oidc_account", error.message), error.status)
    logger.info("signed in %r through OpenID Connect", user.username)
    response = RedirectResponse(
        safe_next(request.session.pop("next", None)), status_code=303, headers=NO_STORE
    )
    response.headers.append("Set-Cookie", session_cookie_header(svc.settings, sign_in.secret))
    return response


async def _verified_claims(request: Request, settings: Settings) -> dict[str, Any]:
    """The ID token's claims once the state is spent, the code exchanged and the token validated."""
    client, query = _client(request), request.query_params
    issuer = await _issuer(client, settings)
    flow = await _spend_state(request, client, query.get("state") or "")
    if error := query.get("error"):  # only now: with an unknown state, its description could be anyone's text
        # the page names only a registered code; the description (the provider's free text) goes to the log
        description = query.get("error_description") or "no description"
        logger.warning("OpenID Connect provider error %r: %r", error[:100], description[:300])
        shown = error if error in SHOWN_ERRORS else "an error code it does not know"
        raise SignInRefused("oidc_provider_error", f"{shown} (the server's log has the details)")
    token = await _exchange(client, query.get("code"), flow)
    claims = await _id_token_claims(client, token, issuer, flow.get("nonce"), settings.oidc_client_id)
    audience = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if others := [str(a)[:100] for a in audience if a != settings.oidc_client_id]:
        # OpenID Connect Core 3.1.3.7 (3): refused when it names audiences not trusted; we trust none but us
        detail = f"the ID token is also meant for {others}: no audience but us is trusted"
        raise SignInRefused("oidc_audience", detail)
    return claims


async def _exchange(client: Any, code: str | None, flow: dict[str, Any]) -> dict[str, Any]:
    """The token response for `code`, with the flow's PKCE verifier and redirect URI."""
    try:
        return await client.fetch_access_token(
            code=code, code_verifier=flow.get("code_verifier"), redirect_uri=flow.get("redirect_uri")
        )
    except AuthlibBaseError as exc:  # an OAuth error in the token response
        detail = f"{exc.error}: {exc.description or 'no description'}"
        raise SignInRefused("oidc_token_endpoint", detail) from None
    except httpx.HTTPStatusError as exc:  # the token endpoint said no: its OAuth error, where it gives one
        detail = f"the provider's token endpoint refused the code: {_oauth_error(exc.response)}"
        raise SignInRefused("oidc_token_endpoint", detail) from None
    except httpx.HTTPError as exc:
        detail = f"the provider's token endpoint cannot be reached: {exc}"
        raise SignInRefused("oidc_token_endpoint", detail) from None


async def _id_token_claims(
    client: Any, token: dict[str, Any], issuer: str, nonce: str | None, client_id: str
) -> dict[str, Any]:
    """The claims of the token response's ID token: its algorithm ours to choose, then authlib's checks."""
    if not token.get("id_token"):  # authlib validates an ID token only when one comes: none is no sign-in
        detail = "the provider's token response holds no ID token (is the openid scope granted?)"
        raise SignInRefused("oidc_no_id_token", detail)
    try:
        alg = extract_compact(str(token["id_token"]).encode()).protected.get("alg")
        if alg not in ID_TOKEN_ALGS:  # authlib would take any alg the discovery document lists
            detail = f"the ID token is signed with {str(alg)[:20]!r}; accepted: {', '.join(ID_TOKEN_ALGS)}"
            raise SignInRefused("oidc_algorithm", detail)
        # authlib checks iss only when given no options, and aud only through azp: name both (RFC 7519 4.1.1/3)
        claims_options = {
            "iss": {"essential": True, "values": [issuer]},
            "aud": {"essential": True, "values": [client_id]},
            "sub": {"essential": True},
        }
        return dict(await client.parse_id_token(token, nonce=nonce, claims_options=claims_options))
    except JoseError as exc:  # signature, iss, aud, azp, exp, iat, nonce
        detail = f"the provider's ID token is not valid ({exc.error}: {exc.description})"
        raise SignInRefused("oidc_id_token", detail) from None
    except httpx.HTTPError as exc:
        raise SignInRefused("oidc_unreachable", f"the provider's JWKS cannot be read: {exc}") from None


async def _spend_state(request: Request, client: Any, state: str) -> dict[str, Any]:
    """The flow of `state` from this browser's flow cookie, spent now: a callback is handled once."""
    flow = await client.framework.get_state_data(request.session, state)
    await client.framework.clear_state_data(request.session, state)
    if not flow:
        detail = (
            "this browser started no sign-in with this state, or it is older than "
            f"{FLOW_MAX_AGE_S} s: start again"
        )
        raise SignInRefused("oidc_state", detail)
    if not request.app.state.oidc.spent.spend(state):
        raise SignInRefused("oidc_state", "this sign-in's callback was already used: start again")
    return flow


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

"""A small OpenID Connect provider for the tests, on 127.0.0.1: discovery, authorize (auto-approves its one user),
token (checks the code, the client, the redirect URI and the PKCE verifier; a code is redeemed once) and JWKS, ID
tokens signed RS256 with joserfc. `Provider.faults` makes it misbehave, one way or several per test (see FAULTS)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

import uvicorn
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

CLIENT_ID, CLIENT_SECRET = "pagedchat-test", "test-client-secret"
IMPOSTOR = "https://impostor.example"
UNTRUSTED_PARTY = "untrusted-party"

# What a hostile (or broken) provider can get wrong, each a claim a client must check or a step it must refuse.
FAULTS = {
    "wrong_issuer": "the ID token's iss names another issuer",
    "discovery_issuer": "the discovery document names another issuer",
    "wrong_audience": "the ID token is for another client (which names us its azp)",
    "extra_audience": "aud is [us, an untrusted party], azp us",
    "extra_audience_no_azp": "aud is [us, an untrusted party], no azp",
    "foreign_azp": "aud is [us, an untrusted party], azp the untrusted party",
    "wrong_nonce": "the nonce is not the one we sent",
    "no_nonce": "the ID token carries no nonce",
    "expired": "exp passed 10 minutes ago",
    "future_iat": "iat is an hour ahead",
    "hs256_public_key": "HS256 keyed with the provider's public key PEM (alg confusion)",
    "alg_none": "an unsigned token (alg none)",
    "foreign_key": "signed by another key under the published kid",
    "unknown_key": "signed by a key the JWKS does not hold, under a kid it does not know",
    "kid_other_key": "signed by the published k1, its header naming the published k2",
    "no_id_token": "the token response holds no ID token",
    "code_reuse": "a code can be redeemed more than once",
    "deny": "the authorization endpoint answers access_denied",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _new_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig"})


@dataclass
class Provider:
    """The provider's state: its signing keys, codes handed out, and what the tests ask it to get wrong."""

    issuer: str
    user: dict[str, str] = field(default_factory=lambda: {"sub": "user-1", "preferred_username": "tess"})
    faults: set[str] = field(default_factory=set)  # names from FAULTS
    key: RSAKey = field(default_factory=lambda: _new_key("k1"))  # signs the ID tokens
    other_key: RSAKey = field(default_factory=lambda: _new_key("k2"))  # published too (a key being rolled in)
    codes: dict[str, dict[str, Any]] = field(default_factory=dict)
    token_requests: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self.discovery),
                Route("/authorize", self.authorize),
                Route("/token", self.token, methods=["POST"]),
                Route("/jwks", self.jwks),
            ]
        )

    async def discovery(self, request: Request) -> Response:
        return JSONResponse(
            {
                "issuer": IMPOSTOR if "discovery_issuer" in self.faults else self.issuer,
                "authorization_endpoint": self.issuer + "/authorize",
                "token_endpoint": self.issuer + "/token",
                "jwks_uri": self.issuer + "/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                # it signs RS256, but lists more, as some providers do (Keycloak lists HS*, the spec allows
                # none): a client must not let the token's header pick from this list
                "id_token_signing_alg_values_supported": ["RS256", "HS256", "none"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            }
        )

    async def authorize(self, request: Request) -> Response:
        """Auto-approves the user: back to the client's redirect URI with a code bound to the request."""
        q = request.query_params
        problems = [
            f"{name} is {q.get(name)!r}"
            for name, ok in (
                ("client_id", q.get("client_id") == CLIENT_ID),
                ("response_type", q.get("response_type") == "code"),
                ("code_challenge_method", q.get("code_challenge_method") == "S256"),
                ("code_challenge", bool(q.get("code_challenge"))),
                ("state", bool(q.get("state"))),
                ("nonce", bool(q.get("nonce"))),
                ("scope", "openid" in q.get("scope", "").split()),
            )
            if not ok
        ]
        if problems:
            return JSONResponse({"error": "invalid_request", "problems": problems}, status_code=400)
        if "deny" in self.faults:
            params = {"error": "access_denied", "error_description": "the user said no", "state": q["state"]}
            return RedirectResponse(q["redirect_uri"] + "?" + urlencode(params), status_code=302)
        code = secrets.token_urlsafe(16)
        self.codes[code] = {k: q[k] for k in ("redirect_uri", "code_challenge", "nonce")}
        return RedirectResponse(q["redirect_uri"] + "?" + urlencode({"code": code, "state": q["state"]}), 302)

    async def token(self, request: Request) -> Response:
        """The code for tokens, once: a second redemption is invalid_grant, as real providers answer."""
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        self.token_requests.append(form)
        code = form.get("code", "")
        grant = self.codes.get(code) if "code_reuse" in self.faults else self.codes.pop(code, None)
        if grant is None or form.get("grant_type") != "authorization_code":
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        if not self._client_authenticated(request, form) or form.get("redirect_uri") != grant["redirect_uri"]:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        verifier = form.get("code_verifier", "")
        if _b64(hashlib.sha256(verifier.encode()).digest()) != grant["code_challenge"]:
            return JSONResponse(
                {"error": "invalid_grant", "error_description": "PKCE verifier"}, status_code=400
            )
        body = {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer", "expires_in": 300}
        if "no_id_token" not in self.faults:
            body["id_token"] = self.id_token(self.claims(grant["nonce"]))
        return JSONResponse(body)

    def claims(self, nonce: str) -> dict[str, Any]:
        """The ID token's claims for the user, as the faults bend them."""
        now, f = int(time.time()), self.faults
        claims: dict[str, Any] = {
            **self.user,
            "iss": IMPOSTOR if "wrong_issuer" in f else self.issuer,
            "aud": CLIENT_ID,
            "azp": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": nonce,
        }
        if "wrong_audience" in f:  # for another client, which names us its authorized party
            claims["aud"] = "someone-else"
        if f & {"extra_audience", "extra_audience_no_azp", "foreign_azp"}:
            claims["aud"] = [CLIENT_ID, UNTRUSTED_PARTY]
        if "extra_audience_no_azp" in f:
            del claims["azp"]
        if "foreign_azp" in f:
            claims["azp"] = UNTRUSTED_PARTY
        if "wrong_nonce" in f:
            claims["nonce"] = "not-the-nonce"
        if "no_nonce" in f:
            del claims["nonce"]
        if "expired" in f:  # beyond any clock-skew leeway
            claims.update(iat=now - 900, exp=now - 600)
        if "future_iat" in f:
            claims.update(iat=now + 3600, exp=now + 3900)
        return claims

    def id_token(self, claims: dict[str, Any]) -> str:
        """`claims` signed as the faults say (RS256 by k1 when none applies)."""
        f = self.faults
        if f & {"alg_none", "hs256_public_key"}:  # by hand: joserfc guards against both
            header = {"alg": "none"} if "alg_none" in f else {"alg": "HS256", "kid": "k1"}
            signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
            if "alg_none" in f:
                return signing_input + "."
            secret = self.key.as_pem(private=False)  # what a verifier that trusts `alg` would use as HMAC key
            return (
                signing_input + "." + _b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())
            )
        key, kid = self.key, "k1"
        if "foreign_key" in f:  # same kid, another key: the signature does not verify
            key = _new_key("k1")
        if "unknown_key" in f:
            key, kid = _new_key("k9"), "k9"
        if "kid_other_key" in f:
            kid = "k2"
        return jwt.encode({"alg": "RS256", "kid": kid}, claims, key)

    async def jwks(self, request: Request) -> Response:
        return JSONResponse(KeySet([self.key, self.other_key]).as_dict(private=False))

    def _client_authenticated(self, request: Request, form: dict[str, str]) -> bool:
        header = request.headers.get("authorization", "")
        if header.startswith("Basic "):
            return base64.b64decode(header[6:]).decode() == f"{CLIENT_ID}:{CLIENT_SECRET}"
        return form.get("client_id") == CLIENT_ID and form.get("client_secret") == CLIENT_SECRET


@contextmanager
def serve_in_thread(app: Any, port: int) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1:`port` in a thread; its base URL while the block runs."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="auto")
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def running_provider() -> Iterator[Provider]:
    """A provider serving on a free loopback port."""
    port = free_port()
    provider = Provider(issuer=f"http://127.0.0.1:{port}")
    with serve_in_thread(provider.app(), port):
        yield provider

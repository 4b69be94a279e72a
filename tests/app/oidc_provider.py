"""A small OpenID Connect provider for the tests, on 127.0.0.1: discovery, authorize (auto-approves its one user),
token (checks the code, the client, the redirect URI and the PKCE verifier) and JWKS, ID tokens signed RS256 with
joserfc. `Provider.faults` makes it misbehave the ways a client must catch (wrong audience, foreign signature, ...)."""

from __future__ import annotations

import base64
import hashlib
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Provider:
    """The provider's state: its signing key, codes handed out, and what the tests ask it to get wrong."""

    issuer: str
    user: dict[str, str] = field(default_factory=lambda: {"sub": "user-1", "preferred_username": "tess"})
    # what to get wrong: wrong_audience, foreign_key, wrong_nonce, wrong_issuer, deny
    faults: set[str] = field(default_factory=set)
    key: RSAKey = field(
        default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "k1", "use": "sig"})
    )
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
                "issuer": self.issuer,
                "authorization_endpoint": self.issuer + "/authorize",
                "token_endpoint": self.issuer + "/token",
                "jwks_uri": self.issuer + "/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
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
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        self.token_requests.append(form)
        grant = self.codes.pop(form.get("code", ""), None)
        if grant is None or form.get("grant_type") != "authorization_code":
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        if not self._client_authenticated(request, form) or form.get("redirect_uri") != grant["redirect_uri"]:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if challenge != grant["code_challenge"]:
            return JSONResponse(
                {"error": "invalid_grant", "error_description": "PKCE verifier"}, status_code=400
            )
        now = int(time.time())
        claims = {
            **self.user,
            "iss": "https://impostor.example" if "wrong_issuer" in self.faults else self.issuer,
            # for another client, which names us its authorized party: only an aud check refuses it
            "aud": "someone-else" if "wrong_audience" in self.faults else CLIENT_ID,
            "azp": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": "not-the-nonce" if "wrong_nonce" in self.faults else grant["nonce"],
        }
        key = self.key
        if "foreign_key" in self.faults:  # same kid, another key: the signature does not verify
            key = RSAKey.generate_key(2048, parameters={"kid": "k1", "use": "sig"})
        id_token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)
        return JSONResponse(
            {
                "access_token": secrets.token_urlsafe(16),
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": id_token,
            }
        )

    async def jwks(self, request: Request) -> Response:
        return JSONResponse(KeySet([self.key]).as_dict(private=False))

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

"""Admission control: which generation requests, new browser identities and password or key guesses get in now,
per client (app/http/limits.py, app/http/login_throttle.py), and nothing new once the server drains."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from app.http.limits import ClientLimiter, IdentityLimiter, Lease
from app.http.login_throttle import WRONG_PASSWORDS, LoginThrottle
from app.http.security import BROWSER_OWNER, client_identity
from app.http.shutdown import Shutdown
from app.settings import Settings


class Admission:
    """The limits of one app, made with it from the settings. Wrong passwords (sign-ins, password changes) and API
    keys are throttled per address and per account as attempts arrive (`password_throttle`); wrong admin tokens per
    address (`login_throttle`)."""

    def __init__(self, settings: Settings, shutdown: Shutdown) -> None:
        self.shutdown = shutdown
        self.limiter = ClientLimiter(settings.client_requests_per_minute, settings.client_max_streams)
        self.identities = IdentityLimiter(settings.new_identities_per_minute)
        self.login_throttle = LoginThrottle()
        self.password_throttle = LoginThrottle(what=WRONG_PASSWORDS)  # and keys (WRONG_KEYS)

    def admit(self, conn: HTTPConnection, owner: str | None = None) -> Lease:
        """Admit one generation request of this caller: 503 while shutting down, 429 past a client limit."""
        self.shutdown.check_admitting()
        return self.limiter.admit(client_identity(conn, owner))

    def admit_new_identity(self, conn: HTTPConnection, owner: str) -> None:
        """A request about to create state for `owner`: when that is a browser identity it was just given (it sent
        no valid cookie), 429 past `new_identities_per_minute` for its address; a valid cookie or API key passes."""
        if owner.startswith(BROWSER_OWNER) and conn.scope.get("state", {}).get("new_browser_id"):
            self.identities.admit(conn.client.host if conn.client else "unknown")

"""The uvicorn server of `pagedchat serve`: guarded connections, and a shutdown that drains before it closes.

On SIGTERM/SIGINT/SIGHUP: the listener closes at once and idle kept-alive connections with it; running replies get
`shutdown_grace_s` to finish; then every stream ends with a final event saying why (services' `end_streams`) and
every WebSocket closes with 1001; only then does uvicorn's own shutdown run (close what is left, lifespan shutdown).
The process exits within the grace period plus a few seconds. When the engine thread dies while serving, the server
stops the same way on its own and exits with ENGINE_FAILURE, for its supervisor to restart it
(`--exit-on-engine-failure`; off, it stays up answering 503). A start that fails on bad input (a ValueError: a
model that cannot be loaded, a limit it exceeds) is logged as one line, without Starlette's traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from app.http.connection_guard import ConnectionGuard, guarded_protocol
from app.http.services import Services
from app.http.shutdown import END_WAIT_S, Shutdown
from app.settings import WILDCARD_ADDRESSES, Settings, host_name

logger = logging.getLogger(__name__)
CLOSE_WAIT_S = END_WAIT_S + 1.0  # after the grace period: streams send their last event, sockets their close
POLL_S = 0.05
# the exit status after the engine died while serving (EX_SOFTWARE): not 0, which a supervisor takes for a stop, nor
# a start-up refusal's 3 (app.cli.STARTUP_FAILURE)
ENGINE_FAILURE = 70


class DrainingServer(uvicorn.Server):
    """uvicorn's Server, draining the app's replies before uvicorn closes the connections."""

    def __init__(self, config: uvicorn.Config, app: Starlette) -> None:
        super().__init__(config)
        self.served_app = app
        self.shutdown_state: Shutdown = app.state.shutdown
        # the process's, once `run` returns (a failed start: uvicorn exits with 3 itself)
        self.exit_status = 0
        self.shutdown_state.on_engine_failure = self.exit_on_engine_failure

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGINT/SIGTERM handlers, and SIGHUP drained the same way: uvicorn leaves SIGHUP to its default
        action, which killed the process at once, replies and all (a closed terminal, a `kill -HUP` meant as a
        reload). A replica set's front replaces this handler with its rolling restart (app/cluster)."""
        with super().capture_signals():
            if (
                threading.current_thread() is not threading.main_thread()
            ):  # signals go to the main thread only
                yield
                return
            previous = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            logger.warning("signal %d: draining (no new replies)", sig)
        self.shutdown_state.start_draining()
        # SIGHUP stops as SIGTERM does: uvicorn raises the signal again once it has shut down, and a process that
        # ends by SIGTERM is a clean stop to systemd, where one ending by SIGHUP is a failure
        sig = signal.SIGTERM if sig == signal.SIGHUP else sig
        super().handle_exit(sig, frame)  # a second SIGINT sets force_exit: the drain stops waiting

    def exit_on_engine_failure(self, reason: str) -> None:
        """The engine died while serving (its replies have failed): drain as on SIGTERM, then exit with
        ENGINE_FAILURE. A stop under way (a signal) goes on as it was."""
        if self.should_exit:
            return
        logger.critical(
            "exiting with status %d so that a supervisor restarts the server: %s (draining first; "
            "--no-exit-on-engine-failure keeps it up, answering 503)",
            ENGINE_FAILURE,
            reason,
        )
        self.exit_status = ENGINE_FAILURE
        self.shutdown_state.start_draining()
        self.should_exit = True  # uvicorn's main loop sees it within its tick, then runs `shutdown`

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # admit no new connection
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            if isinstance(connection, self.config.http_protocol_class):
                connection.shutdown()  # idle: closed now; busy: closed after its response (no keep-alive)
        svc: Services | None = getattr(
            self.served_app.state, "services", None
        )  # None: it stops before it served
        if svc is not None:
            drain = asyncio.ensure_future(svc.drain())
            while not drain.done() and not self.force_exit:
                await asyncio.wait({drain}, timeout=POLL_S * 2)
            svc.end_streams()  # a forced exit skips the rest of the grace period
            await drain
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self.server_state.connections and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(POLL_S)
        await super().shutdown(sockets)


def one_line_startup_errors(app: Starlette) -> Any:
    """`app` as an ASGI callable whose failed start, when a ValueError failed it, reports the error's message only
    (Starlette reports every failed start with the traceback of its lifespan, which uvicorn logs)."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)

        async def send_message(message: Any) -> None:
            error = sys.exc_info()[1]  # Starlette sends startup.failed from inside its except block
            if message["type"] == "lifespan.startup.failed" and isinstance(error, ValueError):
                message = {**message, "message": f"cannot start: {error}"}
            await send(message)

        return await app(scope, receive, send_message)

    return asgi


def check_can_listen(host: str, port: int) -> None:
    """Raise ValueError when `host`:`port` cannot be bound as uvicorn will bind it (SO_REUSEADDR, every address the
    name resolves to): uvicorn binds only after the lifespan has loaded the model, so a port in use was reported
    tens of seconds late."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc}") from exc
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio's create_server: IPv6 only, beside the IPv4 socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                shown = f"[{address[0]}]:{port}" if family == socket.AF_INET6 else f"{address[0]}:{port}"
                hint = (
                    f": another process listens on it (`ss -ltnp 'sport = :{port}'`), or set PAGEDCHAT_PORT"
                    if exc.errno == errno.EADDRINUSE
                    else ""
                )
                raise ValueError(f"cannot listen on {shown}: {exc.strerror or exc}{hint}") from exc


def exposure_warnings(settings: Settings) -> list[str]:
    """What an operator should know at start about who can reach the admin surface and which hosts are answered."""
    warnings = []
    if not settings.admin_token and settings.auth == "none":
        warnings.append(
            "the admin surface is open: no PAGEDCHAT_ADMIN_TOKEN and no accounts, so /admin, /api/admin (live chat "
            "titles included) and /metrics answer anyone on this machine who connects to loopback by the server's "
            "own name, without a proxy in between; on a shared machine set PAGEDCHAT_ADMIN_TOKEN (or use "
            "--auth local with admin accounts)"
        )
    if settings.any_host_allowed:
        warnings.append(
            "--allowed-hosts '*': every Host header is answered, so a web page can reach this server through its "
            "visitors' browsers (DNS rebinding); list the server's names instead"
        )
    elif host_name(settings.host) in WILDCARD_ADDRESSES:
        warnings.append(
            f"listening on {settings.host or 'every address'} but answering only the Host names "
            f"{', '.join(sorted(settings.allowed_host_names))}: add the names clients use to --allowed-hosts"
        )
    if "*" in settings.proxy_addresses:
        warnings.append(
            "--forwarded-allow-ips '*': any client can set its own address with X-Forwarded-For (rate limits and "
            "sign-in throttles count per address); list the proxies' addresses instead"
        )
    return warnings


def build_server(app: Starlette, settings: Settings) -> DrainingServer:
    """The server for `app`: loopback or `settings.host`, guarded HTTP connections, draining shutdown. The app
    reads forwarding headers itself (ProxyMiddleware, `forwarded_allow_ips`): it keeps the connection's own address
    beside the forwarded one, so a request through a proxy is never taken for a loopback client."""
    for warning in exposure_warnings(settings):
        logger.warning(warning)
    guard = ConnectionGuard(settings.client_max_connections, settings.header_timeout_s)
    config = uvicorn.Config(
        one_line_startup_errors(app),
        host=settings.host,
        port=settings.port,
        log_config=None,
        http=guarded_protocol(AutoHTTPProtocol, guard),
        ws_max_size=settings.ws_max_frame_bytes,
        # what is left to close once the app has drained (see DrainingServer.shutdown)
        timeout_graceful_shutdown=int(CLOSE_WAIT_S) + 2,
        proxy_headers=False,  # the app's ProxyMiddleware does it (see above)
    )
    return DrainingServer(config, app)

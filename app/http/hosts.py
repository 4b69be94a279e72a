"""Which host a request names (its Host header) and whether the server answers it; whether a request came through a
reverse proxy; the connection's own address.

A DNS-rebinding page (its name re-pointed at 127.0.0.1 after it loaded) reaches a loopback server from the victim's
browser, and its requests are same-origin to the browser: their Origin equals their Host. Only the Host, the page's
own name, tells them apart, so every HTTP and WebSocket route answers an allowed Host only (app/http/middleware.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.requests import HTTPConnection
from starlette.types import Scope

from app.settings import Settings, host_name

PEER_STATE = "peer"  # scope["state"]: the TCP peer's address, before X-Forwarded-For replaced the client's
# headers a proxy adds (a browser or curl sends none of them): a request that carries one came through a proxy
FORWARDING_HEADERS = (
    b"forwarded",
    b"x-forwarded-for",
    b"x-forwarded-host",
    b"x-forwarded-proto",
    b"x-real-ip",
    b"via",
)
MAX_SHOWN_CHARS = 100


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (latin-1, as HTTP carries it), None when absent."""
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def parse_host(value: str | None) -> str | None:
    """The host part of a Host header (`name`, `name:port`, `[v6]:port`), normalised; None when it is malformed."""
    if value is None:
        return None
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        host, rest = (value[1:end], value[end + 1 :]) if end > 0 else ("", "")
        if host and not _is_ipv6(host):
            return None
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    port = rest.removeprefix(":")
    if (
        not host
        or (rest and not rest.startswith(":"))
        or not (port == "" or (port.isascii() and port.isdigit()))
    ):
        return None
    return host_name(host)


def _is_ipv6(value: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(value), ipaddress.IPv6Address)
    except ValueError:
        return False


def host_matches(host: str, names: Iterable[str]) -> bool:
    """True when `host` is one of `names` or under one of their `*.domain` patterns."""
    return any(host == name or (name.startswith("*.") and host.endswith(name[1:])) for name in names)


def named_host(conn: HTTPConnection, settings: Settings) -> bool:
    """True when the request's Host is one the server answers by name ('*' in allowed_hosts does not count)."""
    host = parse_host(conn.headers.get("host"))
    return host is not None and host_matches(host, settings.allowed_host_names)


def shown(value: str | None) -> str:
    """A header value as an error message may quote it: shortened, repr-escaped."""
    return "no Host header" if value is None else f"Host {value[:MAX_SHOWN_CHARS]!r}"


def client_address(conn: HTTPConnection) -> str:
    """The client's address, what sign-ins record and the throttles count: the connection's, or X-Forwarded-For's
    for a connection from `forwarded_allow_ips` (uvicorn's ProxyHeadersMiddleware has replaced it by then)."""
    return conn.client.host if conn.client else "unknown"


def peer_address(conn: HTTPConnection) -> str | None:
    """The address of the TCP connection itself (a proxy's, when one is in front), whatever X-Forwarded-For says."""
    state = conn.scope.get("state", {})
    if PEER_STATE in state:
        return state[PEER_STATE]
    return conn.client.host if conn.client else None


def came_through_proxy(conn: HTTPConnection, settings: Settings) -> bool:
    """True when the request carries a forwarding header or its connection comes from one of the configured
    proxies (`forwarded_allow_ips`): whoever sent it, it was not the machine's own user talking to loopback."""
    if any(header(conn.scope, name) is not None for name in FORWARDING_HEADERS):
        return True
    return is_proxy(peer_address(conn), settings.proxy_addresses)


def is_proxy(address: str | None, proxies: tuple[str, ...]) -> bool:
    """True when `address` is one of `proxies` (addresses, networks, or '*')."""
    if not proxies or address is None:
        return False
    if "*" in proxies:
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(proxy, strict=False) for proxy in proxies)

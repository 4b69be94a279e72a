"""Keep a local Ray instance on loopback: every listener of Ray, Serve and our replicas binds 127.0.0.1.

Ray binds its gRPC servers to the node's IP; on Linux it resolves "127.0.0.1" to the machine's outward address
unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (single-machine mode, where the node IP is loopback). Ray Serve's
replicas also start an inter-deployment gRPC server on "[::]:0" whatever the node IP; `bind_serve_grpc_to_loopback`
rewrites that address in the replica process (a test lists every listener with `ss` to catch a Ray release that
changes this).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from typing import Any

LOOPBACK = "127.0.0.1"
# set before `import ray` in the driver; inherited by every Ray process it starts
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def _set_cluster_network(enabled: bool) -> None:
    """Ray's node-IP mode: the machine's network address (True) or loopback (False), in the environment for the Ray
    processes this one starts, and in Ray's own copy where ray is imported already (it reads it once, at import)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1" if enabled else "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = enabled


def apply_loopback_env() -> None:
    """Put the loopback-only variables into this process's environment, for the Ray processes it starts."""
    os.environ.update(LOOPBACK_ENV)
    _set_cluster_network(False)


def is_loopback_address(address: str) -> bool:
    """Whether a Ray address (`host:port`, `ray://host:port`, or `local`) names this machine's loopback."""
    if address in ("", "local"):
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: another machine's, as far as we can tell
        return False


def use_cluster_network() -> None:
    """Joining a Ray cluster on other machines: this process's node IP must be its address on their network (the
    one its own `ray start` registered), not loopback, or Ray cannot find the local node and replicas on other nodes
    cannot stream back to it. Undoes `apply_loopback_env`'s node-IP part (usage stats stay off)."""
    _set_cluster_network(True)


def bind_serve_grpc_to_loopback() -> None:
    """In a Serve replica: make its inter-deployment gRPC server listen on 127.0.0.1 instead of every interface."""
    from ray.serve._private import replica as serve_replica

    original = serve_replica.add_port_to_grpc_server
    if getattr(original, "pagedchat_loopback", False):
        return

    def add_port(server: Any, address: str) -> int:
        if address.startswith("[::]:") or address.startswith("0.0.0.0:"):
            address = f"{LOOPBACK}:{address.rsplit(':', 1)[1]}"
        return original(server, address)

    add_port.pagedchat_loopback = True  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = add_port

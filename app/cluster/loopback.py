"""Keep a local Ray instance on loopback: every listener of Ray, Serve and our replicas binds 127.0.0.1.

Ray binds its gRPC servers to the node's IP; on Linux it resolves "127.0.0.1" to the machine's outward address
unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (single-machine mode, where the node IP is loopback). Ray Serve's
replicas also start an inter-deployment gRPC server on "[::]:0" whatever the node IP; `bind_serve_grpc_to_loopback`
rewrites that address in the replica process (a test lists every listener with `ss` to catch a Ray release that
changes this).
"""

from __future__ import annotations

import os
import sys
from typing import Any

LOOPBACK = "127.0.0.1"
# set before `import ray` in the driver; inherited by every Ray process it starts
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def apply_loopback_env() -> None:
    """Put the loopback-only variables into this process's environment, for the Ray processes it starts; Ray reads
    its own copy at import, so where it is imported already that copy is set too."""
    os.environ.update(LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


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

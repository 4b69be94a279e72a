"""Replicas on Ray Serve: engine replicas in a Serve deployment, routed by the KV blocks each one holds.

`pagedchat serve --replicas N` keeps the HTTP surface in its own process (the ingress: one set of rate limits, turn
locks and admin feed) and runs N `LLMEngine`s as replicas of the `EngineReplica` deployment; `ReplicaSetEngine`
gives the app the same interface as the in-process `AsyncEngine`. Ray is an optional extra (`pagedchat[cluster]`):
nothing here is imported unless replicas are asked for.
"""

from app.cluster.loopback import apply_loopback_env

# Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is first imported (ray._private.ray_constants), and
# modules of this package import ray at their top (ray_router): the variable must be set before any of them loads,
# or Ray binds the machine's outward address instead of loopback (`ss -ltnp` shows it).
apply_loopback_env()

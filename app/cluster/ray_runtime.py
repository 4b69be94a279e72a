"""Ray and Serve for `pagedchat serve --replicas N`: start (or join) Ray on loopback, deploy the engine replicas.

Each served model is a Serve application of its own (`app_name`): `--model` is APP_NAME, a model loaded on demand
is `model_app_name(id)`, deployed when it loads and deleted when it unloads, so each model has its own replicas,
router and census.

Ray Serve's HTTP proxy stays off: the ingress is this process's own server, which calls the replicas through a
`DeploymentHandle`. Serve restarts a replica that dies or fails its health check, and a redeploy with a new
version replaces replicas one at a time, each draining its requests first (`graceful_shutdown_timeout_s`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cluster.loopback import LOOPBACK_ENV, is_loopback_address, use_cluster_network
from app.cluster.replica import EngineReplica, ReplicaOptions

if TYPE_CHECKING:
    from app.settings import Settings
    from engine.core.config import EngineConfig

logger = logging.getLogger(__name__)
APP_NAME = "pagedchat"
DEPLOYMENT_NAME = "EngineReplica"
NAMESPACE = "pagedchat"
HEALTH_CHECK_PERIOD_S = 2.0
ROUTING_STATS_PERIOD_S = 0.25


def model_app_name(folder_name: str) -> str:
    """The Serve application of a model loaded on demand (`folder_name`: its id in safe characters)."""
    return f"{APP_NAME}-{folder_name}"


def replica_threads(settings: Settings) -> int:
    """CPU threads of each replica's engine: --threads-per-replica, else the engine's own setting, else 1."""
    return settings.threads_per_replica or settings.engine.num_threads or 1


def start_ray(settings: Settings, num_models: int = 1) -> bool:
    """Start a local Ray instance on loopback, or join `settings.ray_address`; True when this process started it.
    (The package set the loopback environment on import; joining a cluster at another machine's address lifts it.)
    A local instance has CPUs for the replicas of `num_models` models at once: each replica asks Serve for its
    threads, and the memory budget, not Ray, bounds how many models load."""
    if not is_loopback_address(settings.ray_address):
        use_cluster_network()
    import ray

    if ray.is_initialized():
        return False
    local = settings.ray_address in ("", "local")
    if local:
        threads = replica_threads(settings)
        ray.init(
            # "local": a new instance of our own, even where another one runs on this machine (without it,
            # ray.init joins the machine's latest cluster, /tmp/ray/ray_current_cluster, and fails on num_cpus)
            address="local",
            num_cpus=max(os.cpu_count() or 1, settings.replicas * threads * num_models),
            include_dashboard=False,
            namespace=NAMESPACE,
            configure_logging=False,
            log_to_driver=True,
            runtime_env={"env_vars": dict(LOOPBACK_ENV)},
        )
    else:
        present_auth_token()
        ray.init(address=settings.ray_address, namespace=NAMESPACE, configure_logging=False)
    return local


def present_auth_token() -> None:
    """Joining a cluster: present this machine's Ray token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)
    where there is one. `ray start` turns token authentication on when it finds a token, but a driver joining with
    `ray.init(address=...)` sends none unless RAY_AUTH_MODE=token, and a cluster with tokens refuses it
    (InvalidAuthToken). A cluster without token authentication accepts a driver that sends one. An explicit
    RAY_AUTH_MODE is left as it is."""
    try:  # Ray's own rule (it also refreshes Ray's cached config); private, so a fallback follows
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        if "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file()):
            os.environ["RAY_AUTH_MODE"] = "token"
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def deploy(
    settings: Settings, engine_config: EngineConfig, app_name: str = APP_NAME, version: str = "1"
) -> Any:
    """Deploy (or redeploy) one model's engine replicas as the application `app_name` and wait until they serve;
    returns the deployment's handle."""
    from ray import serve

    # imports ray: only after start_ray has set its environment
    from app.cluster.ray_router import replica_router_config

    serve.start(proxy_location="Disabled", http_options={"host": "127.0.0.1"})
    engine_config = dataclasses.replace(engine_config, num_threads=replica_threads(settings))
    options = ReplicaOptions(
        max_queued_requests=settings.max_queued_requests,
        request_timeout_s=settings.request_timeout_s,
        drain_s=settings.shutdown_grace_s,
        generation=version,  # new arguments make a new version: Serve rolls the replicas over to it
    )
    deployment_options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "num_replicas": settings.replicas,
        "ray_actor_options": {"num_cpus": replica_threads(settings)},
        # the engine's own queue answers 503 first: Serve never holds a request back for a busy replica
        "max_ongoing_requests": engine_config.max_num_seqs + settings.max_queued_requests + 16,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": settings.shutdown_grace_s,
        "graceful_shutdown_wait_loop_s": 0.5,
        # one log line per request is the ingress's job; a replica logs its own events only
        "logging_config": {"enable_access_log": False, "log_level": settings.log_level.upper()},
    }
    # Serve pulls each replica's digest every ROUTING_STATS_PERIOD_S; the router ranks replicas by it
    deployment_options["request_router_config"] = replica_router_config(
        settings.routing, ROUTING_STATS_PERIOD_S
    )
    deployment = serve.deployment(EngineReplica).options(**deployment_options)
    logger.info("deploying %d engine replicas of %s (version %s)", settings.replicas, app_name, version)
    try:
        return serve.run(deployment.bind(engine_config, options), name=app_name, route_prefix=None)
    except RuntimeError as exc:
        cause = replica_start_error(app_name)
        if cause is not None:  # bad input (a model that cannot load, a limit it exceeds): say it in one line
            raise ValueError(f"the engine replicas could not start: {cause}") from exc
        raise


def replica_start_error(app_name: str = APP_NAME) -> str | None:
    """The ValueError that stopped the engine replicas from starting, from Serve's status message (None: none)."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    deployment = app.deployments.get(DEPLOYMENT_NAME) if app is not None else None
    message = deployment.message if deployment is not None else ""
    errors = [line.strip() for line in message.splitlines() if line.strip().startswith("ValueError: ")]
    return errors[-1].removeprefix("ValueError: ") if errors else None


def replica_states(app_name: str = APP_NAME) -> dict[str, int]:
    """How many engine replicas Serve has in each state (RUNNING, STARTING, ...)."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    deployment = app.deployments.get(DEPLOYMENT_NAME)
    return dict(deployment.replica_states) if deployment is not None else {}


def replica_actors(app_name: str = APP_NAME) -> list[tuple[str, Any]]:
    """(replica name, actor handle) of every live engine replica actor of the application `app_name`."""
    import ray

    prefix = f"SERVE_REPLICA::{app_name}#{DEPLOYMENT_NAME}#"
    found = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"] if isinstance(entry, dict) else entry
        if isinstance(name, str) and name.startswith(prefix):
            namespace = entry.get("namespace", "serve") if isinstance(entry, dict) else "serve"
            try:
                found.append((name[len(prefix) :], ray.get_actor(name, namespace=namespace)))
            except ValueError:  # gone since the listing
                continue
    return found


def stop(started_ray: bool, app_name: str = APP_NAME) -> None:
    """Delete the engine app `app_name` (its replicas drain), and stop Serve and Ray when this process started
    them (every model's app goes with them)."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        if started_ray:
            serve.shutdown()
        else:
            serve.delete(app_name)
    finally:
        if started_ray:
            ray.shutdown()
